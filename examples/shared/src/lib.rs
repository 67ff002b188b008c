//! What the examples and `palisade compare` share, so that the warehouse benchmark in the
//! comparison is the warehouse simulation itself, not a copy of it.
//!
//! - [`warehouse`]: the warehouse example's command line, its data (stock in an `inventory`
//!   table of its own on PostgreSQL and SQLite, written with the fenced single-row statement
//!   and an audit row in the same transaction), and the warehouse simulation;
//! - [`common`]: the flags, connection, run id and summary line of the use-case examples;
//! - [`sql`]: the use-case examples' own tables on PostgreSQL or SQLite, one block of code
//!   for both ([`with_db!`]);
//! - [`logging`]: the `tracing` subscriber every example installs.
//!
//! Example code, kept as a library for the examples: not a published API.

#![allow(clippy::print_stdout, clippy::print_stderr)] // command-line programs

pub mod common;
pub mod logging;
pub mod sql;
pub mod warehouse;
