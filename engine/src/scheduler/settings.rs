//! The watcher of the live-settings file (the operator mounts a ConfigMap there) that applies
//! changed, valid settings without a restart. The document itself is the contract's
//! ([`pacer_engine_api::settings`]).

use super::SchedulerHandle;
use std::path::PathBuf;
use std::time::Duration;

pub use pacer_engine_api::defaults::DEFAULT_MAX_STEP_MS;
pub use pacer_engine_api::settings::BatchSettings;

/// Polls `path` every `interval` and sends changed, valid settings to the scheduler. Polling
/// (rather than inotify) follows Kubernetes' atomic symlink swap of ConfigMap volumes. An
/// invalid file is logged and ignored: the previous settings stay.
pub async fn watch_settings_file(
    path: PathBuf,
    base: BatchSettings,
    handle: SchedulerHandle,
    interval: Duration,
) {
    let mut last_text: Option<String> = None;
    let mut current = base;
    loop {
        match tokio::fs::read_to_string(&path).await {
            Ok(text) if last_text.as_deref() != Some(text.as_str()) => {
                match BatchSettings::parse_over(current, &text) {
                    Ok(next) if next != current => {
                        tracing::info!(file = %path.display(), ?current, ?next, "batch settings changed");
                        current = next;
                        handle.update_settings(next);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(file = %path.display(), error = %e, "ignoring invalid settings file; previous settings stay")
                    }
                }
                last_text = Some(text);
            }
            Ok(_) => {}
            Err(e) if last_text.is_some() => {
                tracing::warn!(file = %path.display(), error = %e, "settings file unreadable; previous settings stay");
                last_text = None;
            }
            Err(_) => {}
        }
        tokio::time::sleep(interval).await;
    }
}
