//! A TCP proxy on loopback that can stall: it forwards bytes both ways (TLS passes through
//! untouched) until told to stall, then holds every byte, on open connections and new ones,
//! until told to resume. A client sent through it sees an apiserver that stops answering
//! without closing anything — the fault that a request without a timeout waits on forever.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; it stops when dropped.
pub struct StallProxy {
    addr: SocketAddr,
    stalled: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl StallProxy {
    /// Starts a proxy to `target` on a free loopback port, on the current runtime.
    pub async fn start(target: SocketAddr) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (stalled, rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, rx.clone()), pipe(sr, cw, rx));
                });
            }
        });
        StallProxy { addr, stalled, task }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte from now on, both ways, without closing any connection.
    pub fn stall(&self) {
        let _ = self.stalled.send(true);
    }

    /// Forwards again, held bytes first.
    pub fn resume(&self) {
        let _ = self.stalled.send(false);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, waiting out stalls before forwarding each read.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
