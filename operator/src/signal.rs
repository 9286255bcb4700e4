//! Ctrl-C and SIGTERM: one handler for the controller (`run`) and local mode.

/// Resolves when Ctrl-C or SIGTERM arrives, and says which. Where SIGTERM cannot be watched,
/// Ctrl-C still stops.
pub async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    #[cfg(unix)]
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminated = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "interrupted (Ctrl-C)",
        () = terminated => "terminated (SIGTERM)",
    }
}
