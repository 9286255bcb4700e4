//! The subcommands of `pacer-engine`, one module each with its flags and its body; `main` only
//! parses and dispatches.

pub mod bench;
pub mod generate;
pub mod info;
pub mod model;
pub mod profile;
pub mod serve;
