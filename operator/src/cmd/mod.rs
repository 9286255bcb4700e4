//! The subcommands of `pacer-operator`, one module each with its flags and its body: `run` (the
//! controller), and `local` and `simulate`/`calibrate`, each behind the feature of the same name
//! (both on by default): the controller's container image is built without them, so it links
//! neither local mode, the load generator nor the simulator.

use pacer_operator::planner::EngineProfile;
use pacer_operator::planner::profile::ProfileError;
use std::path::Path;

#[cfg(feature = "local")]
pub mod local;
pub mod run;
#[cfg(feature = "simulate")]
pub mod simulate;

/// Reads and checks one engine profile file.
pub fn read_profile(path: &Path) -> Result<EngineProfile, ProfileError> {
    let shown = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|source| ProfileError::Read { path: shown.clone(), source })?;
    EngineProfile::parse(&text, &shown)
}
