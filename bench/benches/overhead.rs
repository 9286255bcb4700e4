//! pacer-bench's own overhead: requests/s and streamed tokens/s one client core sustains
//! against a server that answers instantly (one core too). Goal: far above any engine here.
//!
//!   cargo bench -p pacer-bench --bench overhead
//!
//! The server and the client each get a single-threaded tokio runtime on their own OS thread,
//! so on a 2-core machine each has about one core.

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use pacer_bench::client::{Endpoint, Target};
use pacer_bench::load::{Arrivals, Length};
use pacer_bench::run::{RunPlan, run};

const TOKENS_PER_RESPONSE: usize = 256;

fn main() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("server runtime");
        rt.block_on(async move {
            // One pre-rendered body: 256 content events, a usage chunk, [DONE].
            let mut body = String::new();
            for i in 0..TOKENS_PER_RESPONSE {
                body.push_str(&format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"));
            }
            body.push_str(&format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":8,\"completion_tokens\":{TOKENS_PER_RESPONSE}}}}}\n\ndata: [DONE]\n\n"
            ));
            let body: &'static str = Box::leak(body.into_boxed_str());
            let app = Router::new().route(
                "/v1/chat/completions",
                post(move || async move {
                    Response::builder().header("content-type", "text/event-stream").body(Body::from(body)).expect("response")
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send addr");
            axum::serve(listener, app).await.expect("serve");
        });
    });
    let addr = rx.recv().expect("server address");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("client runtime");
    let target = Target {
        base_url: format!("http://{addr}"),
        model: "m".into(),
        endpoint: Endpoint::Chat,
        api_key: None,
        ignore_eos: false,
        tokenizer: None,
        keep_alive: false,
    };
    for concurrency in [1, 8, 32] {
        let plan = RunPlan {
            arrivals: Arrivals::Closed { concurrency },
            requests: 2000,
            warmup: 20,
            input: Length::Fixed { n: 8 },
            output: Length::Fixed { n: TOKENS_PER_RESPONSE },
            shared_prefix: 0,
            seed: 0,
            max_duration: None,
            dataset: None,
            replay: None,
            turns: 1,
        };
        let result = rt.block_on(run(&target, &plan, || {}));
        let ok = result.records.iter().filter(|r| r.ok()).count();
        let events: usize = result.records.iter().map(|r| r.content_events.len()).sum();
        println!(
            "concurrency {concurrency:>3}: {ok} requests in {:.2} s = {:.0} req/s, {:.0} streamed tokens/s",
            result.duration,
            ok as f64 / result.duration,
            events as f64 / result.duration
        );
    }
}
