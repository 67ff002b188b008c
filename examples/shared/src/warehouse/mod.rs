//! The warehouse: the incident, replayed (see `examples/warehouse/README.md` for the
//! command-line contract).

pub mod cli;
pub mod commands;
pub mod inventory;
pub mod simulate;
