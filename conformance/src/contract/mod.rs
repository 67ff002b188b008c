//! What a backend author meets: the factories a backend supplies (and their hooks), the
//! registry of scenarios, the certification that runs them, and the reference factories.

pub mod certify;
pub(crate) mod factory;
pub(crate) mod fn_factory;
pub mod memory;
pub mod registry;
pub mod report;
