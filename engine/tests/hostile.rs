//! Hostile clients and bad input against the server over real HTTP with the real model: slow
//! and half-open connections, a connection limit, megabytes of prompt, and malformed or
//! unsupported requests, each answered with the right status and an OpenAI error body; clients
//! without the key, a body budget shared by all connections, and a scheduler whose steps fail
//! or hang (through its test-only fault hook).

#![allow(clippy::unwrap_used)]

mod common;

use common::http::{MODEL, config, post, start, start_with_probes};
use pacer_engine::server::ServeConfig;
use serde_json::{Value, json};
use std::time::Duration;

/// Slow and hostile clients: a connection that never finishes its headers is closed after
/// `header_timeout`, a body that never finishes gets a 408 after `body_timeout`, and
/// connections beyond `max_connections` are closed as they arrive (so 500 half-open
/// connections cannot hold 500 descriptors).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_time_out_and_connections_are_limited() {
    // Timeouts well above the time the test takes to open its connections, so no slot frees
    // before the fourth arrives even on a busy machine.
    let url = start(ServeConfig {
        header_timeout: Duration::from_secs(3),
        body_timeout: Duration::from_secs(3),
        max_connections: 3,
        ..config()
    })
    .await;
    let address = url.trim_start_matches("http://").to_string();
    // The readiness probe's connection is closed by now, but the server may not have seen
    // its end yet; give it a moment so the probe does not hold a slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The clients block; they run off the runtime that serves them.
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        use std::net::TcpStream;
        let connect = || {
            let s = TcpStream::connect(&address).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        };
        // Reads until the server closes; returns what it sent and how long that took.
        let until_closed = |s: &mut TcpStream| {
            let started = std::time::Instant::now();
            let mut out = Vec::new();
            let read = s.read_to_end(&mut out);
            let text = String::from_utf8_lossy(&out).into_owned();
            let timed_out = read.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock);
            assert!(!timed_out, "the server kept the connection open: {text}");
            (text, started.elapsed())
        };
        let mut half_headers = connect();
        half_headers.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
        let mut half_body = connect();
        half_body
            .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"mo")
            .unwrap();
        let mut idle = connect();
        // Three connections are open: the fourth is closed at once, unanswered.
        std::thread::sleep(Duration::from_millis(200));
        let mut fourth = connect();
        let _ = fourth.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n");
        let (text, took) = until_closed(&mut fourth);
        assert!(text.is_empty() && took < Duration::from_secs(2), "over the limit: {text:?} after {took:?}");

        let (text, _) = until_closed(&mut half_body);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("\"request_timeout\""), "{text}");
        let (_, took) = until_closed(&mut half_headers);
        assert!(took < Duration::from_secs(8), "half-sent headers held the connection {took:?}");
        let (_, took) = until_closed(&mut idle);
        assert!(took < Duration::from_secs(8), "an idle connection held {took:?}");
    })
    .await
    .unwrap();
    // Their descriptors are free again.
    let r = reqwest::get(format!("{url}/health")).await.unwrap();
    assert_eq!(r.status(), 200);
}

/// A flood of idle connections fills the API port's limit; the probe port keeps answering
/// `/health`, `/ready` and `/metrics`, so the pod is not restarted under the flood and the
/// planner's scrapes go on. The probe port serves nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer_on_their_own_port_under_a_connection_flood() {
    const LIMIT: usize = 16;
    let (url, probes) = start_with_probes(ServeConfig {
        header_timeout: Duration::from_secs(30),
        max_connections: LIMIT,
        ..config()
    })
    .await;
    let address = url.trim_start_matches("http://").to_string();
    // Ten times the limit: every slot is held by a connection that sends nothing.
    let flood: Vec<_> = (0..LIMIT * 10).filter_map(|_| std::net::TcpStream::connect(&address).ok()).collect();
    assert!(flood.len() >= LIMIT);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    // The API port has no slot left: its probes would fail (this is what restarted pods).
    let api = client.get(format!("{url}/health")).send().await;
    assert!(api.is_err(), "the API port answered over its limit: {api:?}");
    for path in ["/health", "/ready", "/metrics"] {
        let r = client.get(format!("{probes}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} on the probe port");
        if path == "/metrics" {
            assert!(r.text().await.unwrap().contains("vllm:num_requests_waiting"));
        }
    }
    let r =
        client.post(format!("{probes}/v1/completions")).json(&serde_json::json!({})).send().await.unwrap();
    assert_eq!(r.status(), 404, "the API is not on the probe port");
    drop(flood);
}

/// Megabytes of prompt are refused by their size before anything tokenizes them, and parsing
/// and tokenizing run off the HTTP runtime: `/health` keeps answering meanwhile (it froze for
/// about 9 s behind two such prompts when they were tokenized on the runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_prompt_is_refused_by_size_and_health_keeps_answering() {
    let url = start(ServeConfig { max_body_bytes: 16 << 20, ..config() }).await;
    let huge = json!({"model": MODEL, "prompt": "word ".repeat(800_000), "max_tokens": 1});
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "word ".repeat(800_000)}]});
    let slow = tokio::spawn({
        let url = url.clone();
        async move {
            let (a, b) =
                tokio::join!(post(&url, "/v1/completions", &huge), post(&url, "/v1/chat/completions", &chat));
            let (a, b): (Value, Value) = (a.json().await.unwrap(), b.json().await.unwrap());
            (a, b)
        }
    });
    let client = reqwest::Client::new();
    let mut slowest = Duration::ZERO;
    while !slow.is_finished() {
        let asked = std::time::Instant::now();
        let r = client.get(format!("{url}/health")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        slowest = slowest.max(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a, b) = slow.await.unwrap();
    for (v, param) in [(a, "prompt"), (b, "messages")] {
        assert_eq!(v["error"]["param"], param, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("4000000 bytes") && message.contains("maximum context length"), "{message}");
    }
    assert!(slowest < Duration::from_secs(2), "/health took {slowest:?} while the prompts were checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_the_right_status_and_an_openai_error_body() {
    let url = start(ServeConfig { api_key: None, ..config() }).await;
    let client = reqwest::Client::new();
    let cases: Vec<(Value, u16, Option<&str>)> = vec![
        (json!({"model": "gpt-4", "prompt": "hi"}), 404, Some("model")),
        (json!({"model": MODEL, "prompt": "hi", "n": 2}), 400, Some("n")),
        (json!({"model": MODEL, "prompt": "hi", "temperature": 5}), 400, Some("temperature")),
        (json!({"model": MODEL, "prompt": "hi", "top_p": 0}), 400, Some("top_p")),
        (json!({"model": MODEL, "prompt": "hi", "max_tokens": 100000}), 400, Some("max_tokens")),
        (json!({"model": MODEL, "prompt": "word ".repeat(9000)}), 400, Some("prompt")),
        (json!({"model": MODEL, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}), 400, Some("stop")),
        (json!({"model": MODEL, "prompt": ["a", "b"]}), 400, Some("prompt")),
        (json!({"model": MODEL, "prompt": [1, 999999]}), 400, Some("prompt")),
        (json!({"model": MODEL}), 400, None),
    ];
    for (body, status, param) in cases {
        let r = post(&url, "/v1/completions", &body).await;
        assert_eq!(r.status(), status, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{body}");
        }
    }
    let r = post(&url, "/v1/chat/completions", &json!({"model": MODEL, "messages": []})).await;
    assert_eq!(r.status(), 400);
    let r = client.post(format!("{url}/v1/completions")).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("invalid request body"));
    // A body declared over the limit is refused from its headers, before any of it is read. The
    // exchange is raw: a client still writing 2 MiB when the server answers and closes may see
    // its write cut (a broken pipe) before it reads the answer, so this one sends the headers
    // alone and reads what comes back.
    let address = url.trim_start_matches("http://").to_string();
    let answer = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&address).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            2 << 20
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "bodies over the limit are refused: {answer}");
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let v: Value = serde_json::from_str(body).expect("413 has OpenAI's error body");
    assert_eq!(
        (&v["error"]["type"], &v["error"]["code"]),
        (&json!("invalid_request_error"), &json!("request_too_large"))
    );

    // Errors of the HTTP layer have the same shape: no route, a wrong method.
    let r = client.get(format!("{url}/v1/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("404 has OpenAI's error body");
    assert!(v["error"]["message"].as_str().unwrap().contains("/v1/nothing"), "{v}");
    let r = client.get(format!("{url}/v1/completions")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert!(r.headers().contains_key("allow"), "405 keeps its Allow header");
    let v: Value = r.json().await.expect("405 has OpenAI's error body");
    assert_eq!(v["error"]["code"], "method_not_allowed", "{v}");

    // A field of the wrong type is named, in JSON's words, not Rust's.
    for (body, param, words) in [
        (
            json!({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}),
            "max_tokens",
            "a non-negative integer",
        ),
        (
            json!({"model": MODEL, "prompt": {"text": "hi"}}),
            "prompt",
            "a string, a list of one string, or a list of token ids",
        ),
        (json!({"model": MODEL, "prompt": "hi", "temperature": "hot"}), "temperature", "a number"),
        (json!({"model": MODEL, "prompt": "hi", "stop": 7}), "stop", "a string or a list of strings"),
        (json!({"prompt": "hi"}), "model", "missing field"),
    ] {
        let r = post(&url, "/v1/completions", &body).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{message}");
        for rust in ["usize", "untagged", "f32", "line 1 column"] {
            assert!(!message.contains(rust), "Rust words in {message:?}");
        }
    }
    let r = post(
        &url,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": 5}]}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages[0].content", "{v}");

    // What the engine does not implement is refused by name, unless neutral.
    let chat_with = |extra: Value| {
        let mut body =
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let tool = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    for (extra, param) in [
        (json!({"tools": tool, "tool_choice": "required"}), "tools"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"response_format": {"type": "json_object"}}), "response_format"),
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": 2}), "logprobs"),
        (json!({"presence_penalty": 0.5}), "presence_penalty"),
        (json!({"logit_bias": {"42": 10}}), "logit_bias"),
    ] {
        let r = post(&url, "/v1/chat/completions", &chat_with(extra.clone())).await;
        assert_eq!(r.status(), 400, "{extra}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let neutral = json!({"tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "logprobs": false,
                         "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u-1"});
    assert_eq!(post(&url, "/v1/chat/completions", &chat_with(neutral)).await.status(), 200);
    for (body, param) in [
        (json!({"model": MODEL, "prompt": "hi", "logprobs": 21}), "logprobs"),
        (json!({"model": MODEL, "prompt": "hi", "logprobs": true}), "logprobs"),
        (json!({"model": MODEL, "prompt": "hi", "top_logprobs": 2}), "top_logprobs"),
    ] {
        let r = post(&url, "/v1/completions", &body).await;
        assert_eq!(
            (r.status().as_u16(), r.json::<Value>().await.unwrap()["error"]["param"].clone()),
            (400, json!(param)),
            "{body}"
        );
    }

    let keyed = start(ServeConfig { api_key: Some("s3cret".into()), ..config() }).await;
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 1});
    assert_eq!(post(&keyed, "/v1/completions", &body).await.status(), 401);
    let ok = client
        .post(format!("{keyed}/v1/completions"))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

/// Clients without the API key get their 401 from the headers alone, before a byte of their
/// body is buffered: 200 connections each declaring a 4 MiB body with a wrong key (800 MiB
/// if read) leave the process's memory where it was, and `/health` keeps answering. A wrong
/// key is refused like a missing one, and the comparison does not depend on where it differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_refused_before_its_body_is_read() {
    const CLIENTS: usize = 200;
    const BODY: usize = 4 << 20;
    let url = start(ServeConfig {
        api_key: Some("s3cret-key".into()),
        max_body_bytes: BODY,
        max_connections: CLIENTS + 8,
        // No help from the body budget here: only the order (the key first) keeps memory down.
        max_buffered_bytes: 2 << 30,
        ..config()
    })
    .await;
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 1});
    for key in ["s3cret-kez", "wrong", "s3cret-key-and-more", ""] {
        let r = reqwest::Client::new()
            .post(format!("{url}/v1/completions"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "key {key:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
    }

    let rss_before = rss_bytes();
    let address = url.trim_start_matches("http://").to_string();
    let flood = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        static CHUNK: [u8; 64 << 10] = [b' '; 64 << 10];
        let threads: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let address = address.clone();
                std::thread::spawn(move || {
                    let mut s = std::net::TcpStream::connect(&address).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let head = format!(
                        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer nope\r\ncontent-type: application/json\r\ncontent-length: {BODY}\r\n\r\n"
                    );
                    s.write_all(head.as_bytes()).unwrap();
                    // The body follows as fast as the server takes it, from a thread of its
                    // own; a server that answers from the headers closes the connection and
                    // the writes stop.
                    let mut writer = s.try_clone().unwrap();
                    let body = std::thread::spawn(move || {
                        let mut sent = 0;
                        while sent < BODY && writer.write_all(&CHUNK).is_ok() {
                            sent += CHUNK.len();
                        }
                    });
                    // The answer's head, read as it arrives (before the close can reset it).
                    let mut answer = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => answer.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    let _ = body.join();
                    String::from_utf8_lossy(&answer).into_owned()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    });
    let client = reqwest::Client::new();
    let mut peak = rss_before;
    while !flood.is_finished() {
        let r = client.get(format!("{url}/health")).timeout(Duration::from_secs(5)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        peak = peak.max(rss_bytes());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answers = flood.await.unwrap();
    for a in &answers {
        assert!(a.starts_with("HTTP/1.1 401"), "{a:.200}");
        assert!(a.to_ascii_lowercase().contains("connection: close"), "{a:.400}");
    }
    // Each client thread's stack and socket buffers are the test's own; what must not appear
    // is the 800 MiB of bodies.
    let grew = peak.saturating_sub(rss_before);
    assert!(grew < 96 << 20, "memory grew by {} MiB under the flood", grew >> 20);
}

/// With the key, bodies are buffered only within `max_buffered_bytes` across all connections:
/// a request beyond it gets a 503 with `Retry-After` at once, and once the budget is back the
/// same request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_buffered_within_one_budget_for_all_connections() {
    let url = start(ServeConfig {
        max_body_bytes: 1 << 20,
        max_buffered_bytes: 1 << 20,
        body_timeout: Duration::from_secs(30),
        ..config()
    })
    .await;
    let address = url.trim_start_matches("http://").to_string();
    // A client that declares the largest body and sends it slowly holds the whole budget.
    use std::io::Write;
    let mut slow = std::net::TcpStream::connect(&address).unwrap();
    slow.write_all(
        format!("POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{{", 1 << 20)
            .as_bytes(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 1});
    let r = post(&url, "/v1/completions", &body).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "server_busy", "{v}");
    drop(slow);
    let mut status = 0;
    for _ in 0..100 {
        status = post(&url, "/v1/completions", &body).await.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "the budget did not come back after the slow client left");
}

/// A forward step that keeps failing, or one that hangs, makes `/health` and `/ready` fail
/// with the cause (so the pod is restarted instead of answering 500s forever); a step that
/// succeeds again, or the hung one finishing, makes them pass again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_hung_scheduler_is_unhealthy() {
    use pacer_engine::scheduler::{Faults, UNHEALTHY_AFTER_FAILED_STEPS};
    let model = common::loaded(pacer_engine::Tier::Q4_0);
    let (url, scheduler) =
        common::http::start_server(model, ServeConfig { stall_timeout: Duration::from_secs(1), ..config() })
            .await;
    let client = reqwest::Client::new();
    let probe = |path: &'static str| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client.get(format!("{url}{path}")).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0});

    scheduler.inject_faults(Faults { fail_steps: UNHEALTHY_AFTER_FAILED_STEPS, ..Faults::default() });
    for n in 1..=UNHEALTHY_AFTER_FAILED_STEPS {
        let r = post(&url, "/v1/completions", &body).await;
        assert_eq!(r.status(), 500, "request {n}");
        let expected = if n < UNHEALTHY_AFTER_FAILED_STEPS { 200 } else { 503 };
        assert_eq!(probe("/health").await.0, expected, "after {n} failed steps");
    }
    // The cause, in OpenAI's error body like every error this server sends.
    let (status, text) = probe("/health").await;
    assert_eq!(status, 503);
    assert!(text.contains("the last 3 forward steps failed"), "{text}");
    assert_eq!(probe("/ready").await.0, 503);
    // The fault is spent: the next step succeeds and health comes back.
    assert_eq!(post(&url, "/v1/completions", &body).await.status(), 200);
    assert_eq!(probe("/health").await, (200, "ok\n".to_string()));
    assert_eq!(probe("/ready").await.0, 200);

    scheduler.inject_faults(Faults { stall: Duration::from_secs(4), ..Faults::default() });
    let request = tokio::spawn({
        let url = url.clone();
        let body = body.clone();
        async move { post(&url, "/v1/completions", &body).await.status().as_u16() }
    });
    let mut seen = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, text) = probe("/health").await;
        if status == 503 {
            seen = Some(text);
            break;
        }
    }
    let text = seen.expect("/health never failed while a step hung");
    assert!(text.contains("a forward step has run for"), "{text}");
    assert_eq!(probe("/ready").await.0, 503);
    assert_eq!(request.await.unwrap(), 200, "the stalled request still completes");
    assert_eq!(probe("/health").await.0, 200);
}

/// This process's resident memory, in bytes (Linux).
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}
