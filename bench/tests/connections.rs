//! pacer-bench against servers that misbehave at the connection level, the way real ones do:
//! llama.cpp's `llama-server` closes a connection right after a streamed response while
//! announcing `Keep-Alive`. A raw TCP server plays each part exactly; only a request whose
//! connection never opened may be sent again.

#![allow(clippy::unwrap_used)]

use pacer_bench::client::{CONNECT_RETRIES, Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::run::{RunPlan, RunResult, run};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with each connection.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Reads one request, streams a full response announcing keep-alive, then closes the
    /// connection after `close_after` without reading anything more.
    CloseAfterStream { close_after: Duration },
    /// Reads one request and closes the connection without answering.
    CloseUnanswered,
}

/// Reads one HTTP/1.1 request (headers, then `Content-Length` bytes of body).
async fn read_request(conn: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return true;
            }
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The SSE response llama-server sends, chunked, with its `Keep-Alive` header.
fn streamed_response() -> Vec<u8> {
    let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\
Keep-Alive: timeout=5, max=100\r\n\r\n"
        .to_vec();
    let events = [
        r#"data: {"choices":[{"index":0,"text":"a"}]}"#,
        r#"data: {"choices":[{"index":0,"text":"b"}]}"#,
        r#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        "data: [DONE]",
    ];
    for e in events {
        let data = format!("{e}\n\n");
        out.extend_from_slice(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes());
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// Serves `listener` as `behaviour`; returns the count of accepted connections.
fn serve(listener: TcpListener, behaviour: Behaviour) -> Arc<AtomicUsize> {
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if !read_request(&mut conn).await {
                    return;
                }
                match behaviour {
                    Behaviour::CloseAfterStream { close_after } => {
                        let _ = conn.write_all(&streamed_response()).await;
                        tokio::time::sleep(close_after).await;
                    }
                    Behaviour::CloseUnanswered => {}
                }
                // Dropping the stream closes it; whatever the client wrote meanwhile is unread.
            });
        }
    });
    accepted
}

fn target(url: String, keep_alive: bool) -> Target {
    Target {
        base_url: url,
        model: "m".into(),
        endpoint: Endpoint::Completions,
        api_key: None,
        ignore_eos: false,
        tokenizer: None,
        keep_alive,
    }
}

fn plan(concurrency: usize, requests: usize) -> RunPlan {
    RunPlan {
        arrivals: Arrivals::Closed { concurrency },
        requests,
        warmup: 0,
        input: Length::Fixed { n: 4 },
        output: Length::Fixed { n: 2 },
        shared_prefix: 0,
        seed: 1,
        max_duration: Some(Duration::from_secs(60)),
        dataset: None,
        replay: None,
        turns: 1,
    }
}

async fn against(behaviour: Behaviour, keep_alive: bool, requests: usize) -> (RunResult, usize) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = serve(listener, behaviour);
    let result = run(&target(url, keep_alive), &plan(2, requests), || {}).await;
    (result, accepted.load(Ordering::SeqCst))
}

fn failures(r: &RunResult) -> Vec<&str> {
    r.records.iter().filter_map(|r| r.error.as_deref()).collect()
}

#[tokio::test]
async fn a_server_that_closes_after_each_stream_fails_no_request() {
    // The close comes 5 ms after the last chunk: a client that reuses the connection has written
    // its next request by then, as one racing llama-server's 0.2 ms does some of the time.
    let closes = Behaviour::CloseAfterStream { close_after: Duration::from_millis(5) };
    let (result, accepted) = against(closes, false, 24).await;
    assert_eq!(failures(&result), Vec::<&str>::new());
    assert_eq!(result.records.len(), 24);
    assert!(result.records.iter().all(|r| r.output_tokens == 2 && r.retries == 0));
    assert_eq!(accepted, 24, "one connection per request");

    // What the fresh connections avoid: with keep-alive, requests are written into connections
    // the server is closing, and fail. They are not sent again (the server might have read them).
    // The client sees an end of stream or, when the server closes with the request unread in
    // its buffer, a reset.
    let (result, _) = against(closes, true, 24).await;
    let failed = failures(&result);
    assert!(!failed.is_empty(), "reusing the connection races the close");
    assert!(
        failed.iter().all(|e| e.contains("connection closed before message completed")
            || e.contains("Connection reset by peer")),
        "{failed:?}"
    );
    assert!(result.records.iter().all(|r| r.retries == 0));
}

#[tokio::test]
async fn a_request_the_server_read_is_never_sent_twice() {
    let (result, accepted) = against(Behaviour::CloseUnanswered, false, 6).await;
    assert_eq!(failures(&result).len(), 6, "each unanswered request is a failure");
    assert_eq!(accepted, 6, "and none was sent again");
    assert!(result.records.iter().all(|r| r.retries == 0));
}

#[tokio::test]
async fn a_connection_that_could_not_open_is_retried() {
    // Nothing listens on the port for the first 120 ms (a server restarting).
    let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let up = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(120)).await;
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        serve(listener, Behaviour::CloseAfterStream { close_after: Duration::ZERO })
    });
    let result = run(&target(url, false), &plan(1, 1), || {}).await;
    let accepted = up.await.unwrap();
    assert_eq!(failures(&result), Vec::<&str>::new());
    let retries = result.records[0].retries;
    assert!((1..=CONNECT_RETRIES).contains(&retries), "retried {retries} times");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // A server that never comes up: the request fails after the retries, saying why.
    let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let result = run(&target(format!("http://127.0.0.1:{port}"), false), &plan(1, 1), || {}).await;
    assert_eq!(result.records[0].retries, CONNECT_RETRIES);
    let error = result.records[0].error.as_deref().unwrap();
    assert!(error.contains("Connection refused") || error.contains("connect"), "{error}");
}
