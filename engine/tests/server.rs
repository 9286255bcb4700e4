//! The OpenAI-compatible server over real HTTP with the real model: response shapes and SSE
//! framing, continuous batching that changes no greedy output, backpressure (429), client
//! disconnects, errors, live settings, and the drain on SIGTERM.

#![allow(clippy::unwrap_used)]

mod common;

use common::http::{MODEL, chat, config, metric, post, sse_data, start};
use pacer_engine::scheduler::BatchSettings;
use pacer_engine::server::ServeConfig;
use serde_json::{Value, json};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_answer_with_openai_shapes() {
    let url = start(config()).await;
    let r = post(&url, "/v1/chat/completions", &chat("What is the capital of France?", 24)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("Paris"), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"],
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );

    let r = post(
        &url,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);

    let models: Value = reqwest::get(format!("{url}/v1/models")).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_use_exact_openai_sse_framing() {
    let url = start(config()).await;
    let mut body = chat("Name a color.", 8);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(&url, "/v1/chat/completions", &body).await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse_data(&r.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "role chunk first");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]), "usage chunk has empty choices");
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let text: String = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert!(!text.is_empty());

    // Completions stream: no role chunk, text deltas, and no usage unless asked.
    let r = post(
        &url,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Once upon", "max_tokens": 4, "stream": true, "temperature": 0}),
    )
    .await;
    let events = sse_data(&r.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(events.iter().all(|e| !e.contains("\"usage\"")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_greedy_streams_equal_the_same_requests_one_at_a_time() {
    let url = start(config()).await;
    let questions: Vec<String> =
        (0..8).map(|i| format!("Give me fact number {i} about the ocean.")).collect();
    let text_of = |v: Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let mut alone = Vec::new();
    for q in &questions {
        alone.push(text_of(post(&url, "/v1/chat/completions", &chat(q, 24)).await.json().await.unwrap()));
    }
    let together = futures::future::join_all(questions.iter().map(|q| {
        let url = url.clone();
        let body = chat(q, 24);
        async move { post(&url, "/v1/chat/completions", &body).await.json::<Value>().await.unwrap() }
    }))
    .await;
    let together: Vec<String> = together.into_iter().map(text_of).collect();
    assert_eq!(alone, together);
    assert!(metric(&url, "pacer_engine_batch_size_count").await > 0.0);
}

/// KV blocks are taken as sequences grow, and a pool that runs out preempts the newest
/// sequence for recompute instead of failing anyone: five chats that together need far more
/// than a 256-token cache run side by side, each gives exactly its greedy answer alone, and the
/// preemptions are counted. (When the whole budget was reserved at admission, they ran one at a
/// time: as many steps as tokens.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chats_larger_than_the_kv_cache_together_run_side_by_side_by_preemption() {
    let url = start(ServeConfig { kv_cache_tokens: 256, ..config() }).await;
    let body = |i: usize| {
        let mut b = chat(&format!("Give me fact number {i} about the ocean."), 64);
        b["ignore_eos"] = json!(true);
        b
    };
    let text_of = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let mut alone = Vec::new();
    for i in 0..5 {
        let v: Value = post(&url, "/v1/chat/completions", &body(i)).await.json().await.unwrap();
        alone.push(text_of(&v));
    }
    let steps_before = metric(&url, "pacer_engine_batch_size_count").await;
    let together = futures::future::join_all((0..5).map(|i| {
        let url = url.clone();
        let b = body(i);
        async move { post(&url, "/v1/chat/completions", &b).await.json::<Value>().await.unwrap() }
    }))
    .await;
    let mut tokens = 0;
    for v in &together {
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        let (prompt, completion) = (
            v["usage"]["prompt_tokens"].as_u64().unwrap(),
            v["usage"]["completion_tokens"].as_u64().unwrap(),
        );
        assert_eq!(completion, 64, "{v}");
        assert!(prompt + completion > 256 / 5, "each chat needs more than a fifth of the cache: {v}");
        tokens += completion;
    }
    let together: Vec<String> = together.iter().map(text_of).collect();
    assert_eq!(alone, together, "preemption and recompute change no greedy output");
    assert!(
        metric(&url, "vllm:num_preemptions_total").await > 0.0,
        "the pool ran out, so someone was preempted"
    );
    let steps = metric(&url, "pacer_engine_batch_size_count").await - steps_before;
    assert!(steps < tokens as f64, "{steps} steps for {tokens} tokens: the chats never shared a step");
    assert_eq!(metric(&url, "vllm:kv_cache_usage_perc").await, 0.0, "every block came back");
}

/// The prefix cache: a request whose prompt starts like an earlier one's (a shared system
/// prompt, the same request again) takes the earlier KV blocks instead of computing them,
/// counts them in `vllm:prefix_cache_hits_total`, and answers exactly what it answers
/// without the hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_prefix_is_computed_once_and_changes_no_output() {
    let url = start(config()).await;
    let system = "You are a careful assistant for a shipping company. ".repeat(12);
    let ask = |question: &str| {
        json!({"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]})
    };
    let text_of = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let hits = || metric(&url, "vllm:prefix_cache_hits_total");
    assert_eq!(hits().await, 0.0);
    let first: Value =
        post(&url, "/v1/chat/completions", &ask("Where is my parcel?")).await.json().await.unwrap();
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    assert!(prompt > 100.0, "the system prompt spans several blocks: {first}");
    assert_eq!(hits().await, 0.0, "nothing was cached before the first request");

    // The same request again: every full block but the one holding the last token is a hit.
    let again: Value =
        post(&url, "/v1/chat/completions", &ask("Where is my parcel?")).await.json().await.unwrap();
    assert_eq!(text_of(&again), text_of(&first), "a hit changes no greedy output");
    let after_again = hits().await;
    assert!(after_again >= prompt - 32.0 && after_again < prompt, "{after_again} of {prompt} tokens");

    // Another question under the same system prompt reuses the system prompt's blocks.
    let other: Value =
        post(&url, "/v1/chat/completions", &ask("Can I change the address?")).await.json().await.unwrap();
    assert!(hits().await - after_again >= 96.0, "the shared system prompt was found");
    assert!(metric(&url, "vllm:prefix_cache_queries_total").await >= 3.0 * prompt - 16.0);
    assert_eq!(other["choices"][0]["finish_reason"], "length", "{other}");
    assert_eq!(metric(&url, "vllm:kv_cache_usage_perc").await, 0.0, "cached blocks count as free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let settings = BatchSettings { max_batch_size: 1, ..BatchSettings::default() };
    let url = start(ServeConfig { max_waiting: 1, settings, ..config() }).await;
    let long = json!({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 200, "ignore_eos": true, "temperature": 0});
    let running = tokio::spawn({
        let (url, long) = (url.clone(), long.clone());
        async move { post(&url, "/v1/completions", &long).await.status() }
    });
    // Wait until the first request runs, then fill the one waiting slot.
    while metric(&url, "vllm:num_requests_running").await < 1.0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = tokio::spawn({
        let (url, long) = (url.clone(), long.clone());
        async move { post(&url, "/v1/completions", &long).await.status() }
    });
    while metric(&url, "vllm:num_requests_waiting").await < 1.0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The waiting request's prompt is prefill work ahead: the planner's leading signal.
    let mut queued = 0.0;
    for _ in 0..200 {
        queued = metric(&url, "pacer_engine_queued_prompt_tokens").await;
        if queued >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(queued >= 1.0, "pacer_engine_queued_prompt_tokens {queued} with a request waiting");
    let r = post(&url, "/v1/completions", &long).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (&v["error"]["type"], &v["error"]["code"]),
        (&json!("requests"), &json!("rate_limit_exceeded")),
        "{v}"
    );
    assert!(v["error"]["message"].as_str().unwrap().contains("queue is full"), "{v}");
    assert_eq!(running.await.unwrap(), 200);
    assert_eq!(waiting.await.unwrap(), 200);
    assert_eq!(
        metric(&url, "pacer_engine_requests_rejected_total{model_name=\"smol\",reason=\"queue_full\"}").await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_frees_its_sequence() {
    let url = start(config()).await;
    let body = json!({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut r = post(&url, "/v1/completions", &body).await;
    let first = r.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    assert_eq!(metric(&url, "vllm:num_requests_running").await, 1.0);
    drop(r);
    for _ in 0..200 {
        if metric(&url, "vllm:num_requests_running").await == 0.0 {
            assert_eq!(metric(&url, "vllm:request_success_total{finished_reason=\"abort\"").await, 1.0);
            assert_eq!(metric(&url, "vllm:kv_cache_usage_perc").await, 0.0);
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the cancelled sequence kept running");
}

/// With a KV cache smaller than the context, a chat without `max_tokens` (what SDKs send) runs
/// within what the cache holds, and a request that could never fit gets a 400 naming the field
/// before anything streams (it was a 500, or a 200 with an in-band error and no `[DONE]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_kv_cache_cannot_hold_is_a_400_before_streaming() {
    let url = start(ServeConfig { kv_cache_tokens: 256, ..config() }).await;
    let ask = |extra: Value| {
        let mut body = chat("Say hi.", 1);
        body.as_object_mut().unwrap().remove("max_tokens");
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let r = post(&url, "/v1/chat/completions", &ask(json!({"ignore_eos": true}))).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let used = v["usage"]["total_tokens"].as_u64().unwrap();
    assert!(used <= 256 && v["choices"][0]["finish_reason"] == "length", "{v}");
    for stream in [false, true] {
        let r = post(&url, "/v1/chat/completions", &ask(json!({"max_tokens": 1000, "stream": stream}))).await;
        assert_eq!(r.status(), 400, "stream: {stream}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], "max_tokens", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("--kv-cache-tokens"), "{v}");
    }
    let long = json!({"model": MODEL, "messages": [{"role": "user", "content": "word ".repeat(400)}]});
    let r = post(&url, "/v1/chat/completions", &long).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settings_file_changes_the_batch_size_without_a_restart() {
    let dir = std::env::temp_dir().join(format!("pacer-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("settings.json");
    std::fs::write(&file, r#"{"max_batch_size": 8}"#).unwrap();
    let url = start(ServeConfig { settings_file: Some(file.clone()), ..config() }).await;
    let info = |n: usize| format!("pacer_engine_info{{batch_wait_ms=\"0\",max_batch_size=\"{n}\"");
    let wait_for = |n: usize| {
        let url = url.clone();
        let prefix = info(n);
        async move {
            for _ in 0..100 {
                let text = reqwest::get(format!("{url}/metrics")).await.unwrap().text().await.unwrap();
                if text.lines().any(|l| l.starts_with(&prefix)) {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    };
    assert!(wait_for(8).await, "initial file applied");
    std::fs::write(&file, r#"{"max_batch_size": 3}"#).unwrap();
    assert!(wait_for(3).await, "change applied");
    std::fs::write(&file, r#"{"max_batch_size": 0}"#).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(wait_for(3).await, "an invalid file keeps the previous settings");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sigterm_drains_without_cutting_a_stream_and_exits_zero() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pacer-engine"))
        .args(["serve", "--port", &port.to_string(), "--served-model-name", MODEL, "--drain-timeout", "60"])
        .env("PACER_MODEL", common::model_path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let request = |path: &str, body: &str| {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        Ok::<_, std::io::Error>(s)
    };
    let get_status = |path: &str| -> Option<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").ok()?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).ok()?;
        line.split(' ').nth(1)?.parse().ok()
    };
    let mut ready = false;
    for _ in 0..400 {
        if get_status("/ready") == Some(200) {
            ready = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready, "server never became ready");
    let body = json!({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 120, "ignore_eos": true, "stream": true}).to_string();
    let mut stream = request("/v1/completions", &body).unwrap();
    let mut first = [0u8; 64];
    stream.read_exact(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("HTTP/1.1 200"));
    let status =
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    // Readiness goes false at once while the stream continues.
    let mut saw_not_ready = false;
    for _ in 0..100 {
        match get_status("/ready") {
            Some(503) | None => {
                saw_not_ready = true;
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    assert!(saw_not_ready, "readiness must fail during the drain");
    let mut rest = String::new();
    stream.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("\"finish_reason\":\"length\""), "the stream ran to its end: {rest}");
    assert!(rest.contains("data: [DONE]"));
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit status {exit}");
}

/// `--drain-timeout` is a hard limit: a stream still running at the deadline ends with an error
/// event and `[DONE]`, a half-sent request and an idle keep-alive connection do not hold the
/// process, and it exits about a second after the deadline.
#[test]
fn sigterm_past_the_drain_timeout_cuts_streams_and_exits_in_time() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pacer-engine"))
        .args(["serve", "--port", &port.to_string(), "--served-model-name", MODEL, "--drain-timeout", "2"])
        .env("PACER_MODEL", common::model_path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let connect = || TcpStream::connect(("127.0.0.1", port));
    let mut ready = false;
    for _ in 0..400 {
        if let Ok(mut s) = connect() {
            let _ = write!(s, "GET /ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            let mut line = String::new();
            if BufReader::new(s).read_line(&mut line).is_ok() && line.contains(" 200 ") {
                ready = true;
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ready, "server never became ready");
    // A stream far longer than the drain timeout.
    let body = json!({"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "ignore_eos": true, "stream": true}).to_string();
    let mut stream = connect().unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut first = [0u8; 64];
    stream.read_exact(&mut first).unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("HTTP/1.1 200"));
    // A request whose body never finishes, and one whose headers never do.
    let mut half_body = connect().unwrap();
    write!(half_body, "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{{\"mo")
        .unwrap();
    let mut half_headers = connect().unwrap();
    write!(half_headers, "POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();

    let signalled = std::time::Instant::now();
    let status =
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    let rest = String::from_utf8_lossy(&rest);
    let cut = rest.find("drain deadline").unwrap_or_else(|| panic!("no error event at the deadline: {rest}"));
    assert!(rest[cut..].contains("data: [DONE]"), "no [DONE] after the error event: {rest}");
    assert!(rest.ends_with("0\r\n\r\n"), "the chunked body is closed properly: {rest}");
    let exit = child.wait().unwrap();
    let took = signalled.elapsed();
    assert!(exit.success(), "exit status {exit}");
    // 2 s of drain, 1 s of grace; the rest is slack for a busy machine.
    assert!(took < Duration::from_secs(8), "exited {took:?} after SIGTERM with --drain-timeout 2");
    drop((half_body, half_headers));
}

#[test]
fn context_length_caps_what_a_request_may_use() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pacer-engine"))
        .args(["serve", "--port", &port.to_string(), "--served-model-name", MODEL, "--context-length", "32"])
        .env("PACER_MODEL", common::model_path())
        .env_remove("NO_COLOR")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let call = |method: &str, path: &str, body: &str| -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let mut rest = String::new();
        reader.read_to_string(&mut rest).ok()?;
        Some((line.split(' ').nth(1)?.parse().ok()?, rest))
    };
    let ready = (0..400).any(|_| {
        let ok = call("GET", "/ready", "").is_some_and(|(s, _)| s == 200);
        if !ok {
            std::thread::sleep(Duration::from_millis(50));
        }
        ok
    });
    assert!(ready, "server never became ready");
    let (_, models) = call("GET", "/v1/models", "").unwrap();
    assert!(models.contains("\"max_model_len\":32"), "{models}");
    // 20 words are more than 32 tokens with the answer's room: a clear 400, not a truncation.
    let body = json!({"model": MODEL, "prompt": "one two three four five six seven eight nine ten ".repeat(4), "max_tokens": 8}).to_string();
    let (status, text) = call("POST", "/v1/completions", &body).unwrap();
    assert_eq!(status, 400, "{text}");
    child.kill().unwrap();
    let _ = child.wait();
    // Logs to a pipe are plain text: no colour codes off a terminal.
    let mut logs = String::new();
    child.stderr.take().unwrap().read_to_string(&mut logs).unwrap();
    assert!(logs.contains("serving"), "{logs}");
    assert!(!logs.contains('\x1b'), "colour codes in piped logs: {logs:?}");
}

/// `ignore_eos` streams a chunk for every generated token: the answer that would end after a
/// dozen tokens goes on as text, with no end-of-turn token among them that streams nothing
/// (a client saw a doubled inter-token gap at each, where llama-server, which never draws
/// them, showed none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_eos_streams_a_chunk_for_every_token() {
    let url = start(config()).await;
    let mut body = chat("What is the capital of France?", 48);
    body["ignore_eos"] = json!(true);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post(&url, "/v1/chat/completions", &body).await.text().await.unwrap();
    let (mut chunks, mut completion) = (0, 0);
    for data in sse_data(&text).into_iter().filter(|d| d != "[DONE]") {
        let v: Value = serde_json::from_str(&data).unwrap();
        if v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
            chunks += 1;
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            completion = n;
        }
    }
    assert_eq!((chunks, completion), (48, 48), "{text}");
}

/// Log probabilities on both endpoints, whole and streamed: one entry per generated token (the
/// end-of-turn token excepted), whose bytes spell the answer; greedy picks the most likely
/// token, so its log probability is the first alternative's; the alternatives come most
/// likely first and their probabilities sum to at most 1; streaming gives the same entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_probabilities_on_both_endpoints_whole_and_streamed() {
    let url = start(config()).await;
    let mut chat = chat("Name three colours.", 12);
    chat["logprobs"] = json!(true);
    chat["top_logprobs"] = json!(3);
    let v: Value = post(&url, "/v1/chat/completions", &chat).await.json().await.unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(content.len(), if finish == "stop" { generated - 1 } else { generated }, "{v}");
    let bytes: Vec<u8> = content
        .iter()
        .flat_map(|e| e["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
        .collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), text);
    for e in &content {
        let lp = e["logprob"].as_f64().unwrap();
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        assert!(
            lp <= 0.0 && (lp - top[0]["logprob"].as_f64().unwrap()).abs() < 1e-6,
            "greedy takes the top: {e}"
        );
        assert_eq!(e["token"], top[0]["token"]);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            lps.windows(2).all(|w| w[0] >= w[1]) && lps.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-6
        );
    }

    // Streamed: the same entries, spread over the chunks.
    chat["stream"] = json!(true);
    let body = post(&url, "/v1/chat/completions", &chat).await.text().await.unwrap();
    let mut streamed = Vec::new();
    for data in sse_data(&body).into_iter().filter(|d| d != "[DONE]") {
        let chunk: Value = serde_json::from_str(&data).unwrap();
        if let Some(entries) = chunk["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(entries.iter().cloned());
        }
    }
    assert_eq!(streamed, content, "streamed entries equal the whole answer's");

    // Legacy completions: parallel lists, offsets into the text, N alternatives.
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
                      "logprobs": 2});
    let v: Value = post(&url, "/v1/completions", &body).await.json().await.unwrap();
    let text = v["choices"][0]["text"].as_str().unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), 8);
    assert_eq!(tokens.concat(), text);
    let offsets: Vec<u64> =
        lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(top.len() <= 2 && !top.is_empty());
        let best = top.values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert!((best - lp["token_logprobs"][i].as_f64().unwrap()).abs() < 1e-6);
    }
    // Not asked: null, as before.
    let plain: Value =
        post(&url, "/v1/completions", &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2}))
            .await
            .json()
            .await
            .unwrap();
    assert!(plain["choices"][0]["logprobs"].is_null());
}
