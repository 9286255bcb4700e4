//! The chart's values: the README's table of them, generated from `values.yaml`'s `# --`
//! comments (the helm-docs convention: one row per documented key, with its default as YAML and
//! its description; the README holds it between two markers, a test compares them, and
//! `PACER_BLESS=1` rewrites it), and values that reach the operator's pod as given.

use super::{args_of, chart, helm, operator_container, render, text};
use serde_json::json;

/// Where the table sits in the README.
pub const BEGIN: &str = "<!-- values:begin (generated from values.yaml; PACER_BLESS=1 cargo test -p pacer-operator --test integration chart::) -->";
/// The end of the table.
pub const END: &str = "<!-- values:end -->";

/// The Markdown table of every documented key of `values` (a `values.yaml` text).
pub fn table(values: &str) -> String {
    let mut rows = Vec::new();
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut doc: Option<String> = None;
    let lines: Vec<&str> = values.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        i += 1;
        if let Some(text) = trimmed.strip_prefix("# -- ") {
            doc = Some(text.to_string());
            continue;
        }
        if let (Some(d), Some(text)) = (doc.as_mut(), trimmed.strip_prefix("# ")) {
            d.push(' ');
            d.push_str(text);
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            doc = None;
            continue;
        }
        let Some((key, rest)) = trimmed.split_once(':') else { continue };
        if key.contains(' ') {
            continue;
        }
        path.retain(|(level, _)| *level < indent);
        path.push((indent, key.to_string()));
        let Some(description) = doc.take() else { continue };
        let mut default = rest.trim().to_string();
        if default.is_empty() {
            // A map or list written as a block: its lines, flattened.
            let mut block = Vec::new();
            while i < lines.len() {
                let next = lines[i];
                let next_indent = next.len() - next.trim_start().len();
                if next.trim().is_empty() || next_indent <= indent {
                    break;
                }
                block.push(next.trim().to_string());
                i += 1;
            }
            default = block.join(" ");
        }
        let key = path.iter().map(|(_, k)| k.as_str()).collect::<Vec<_>>().join(".");
        rows.push(format!(
            "| `{key}` | `{}` | {} |",
            default.replace('|', "\\|"),
            description.replace('|', "\\|")
        ));
    }
    let mut out = String::from("| key | default | description |\n|---|---|---|\n");
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// The table as the README holds it now, if the markers are there.
pub fn in_readme(readme: &str) -> Option<&str> {
    let start = readme.find(BEGIN)? + BEGIN.len();
    let end = readme[start..].find(END)? + start;
    Some(readme[start..end].trim_matches('\n'))
}

/// The chart README's table of values is generated from `values.yaml`: every documented key,
/// its default and its description. `PACER_BLESS=1` rewrites it.
#[test]
fn the_chart_readme_lists_every_value() {
    let values = std::fs::read_to_string(chart().join("values.yaml")).expect("values.yaml");
    let readme_path = chart().join("README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("README.md");
    let table = table(&values);
    let documented = values.matches("# -- ").count();
    assert_eq!(table.lines().count() - 2, documented, "a `# --` comment with no key after it:\n{table}");
    if std::env::var_os("PACER_BLESS").is_some() {
        let start = readme.find(BEGIN).expect("the begin marker") + BEGIN.len();
        let end = readme[start..].find(END).expect("the end marker") + start;
        let updated = format!("{}\n\n{table}\n{}", &readme[..start], &readme[end..]);
        std::fs::write(&readme_path, updated).expect("write README.md");
        return;
    }
    let committed = in_readme(&readme).expect("the README's markers");
    let stale = committed.lines().zip(table.lines()).find(|(a, b)| a != b);
    assert!(
        stale.is_none() && committed.lines().count() == table.lines().count(),
        "charts/pacer/README.md's table of values is stale (first difference: {stale:?}): \
         PACER_BLESS=1 cargo test -p pacer-operator --test integration chart::"
    );
}

/// `operator.extraVolumes` and `operator.extraVolumeMounts` reach the pod as given (e.g. a
/// Secret with a Prometheus token), and a mount without a path is refused by the schema.
#[test]
fn extra_volumes_are_mounted_into_the_operator_pod() {
    let volume = json!({"name": "prom-token", "secret": {"secretName": "prom-token"}});
    let mount = json!({"name": "prom-token", "mountPath": "/var/run/prom", "readOnly": true});
    let objects = render(&[
        "--set-json",
        &format!("operator.extraVolumes=[{volume}]"),
        "--set-json",
        &format!("operator.extraVolumeMounts=[{mount}]"),
        "--set",
        "prometheus.url=http://prometheus:9090",
        "--set",
        "prometheus.tokenFile=/var/run/prom/token",
    ]);
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"].as_array().expect("volumes");
    assert!(volumes.contains(&volume), "{volumes:?}");
    let container = operator_container(&objects);
    let mounts = container["volumeMounts"].as_array().expect("volumeMounts");
    assert!(mounts.contains(&mount), "{mounts:?}");
    assert!(args_of(container).contains(&"--prometheus-token-file=/var/run/prom/token".to_string()));

    let out = helm(&[
        "template",
        "pacer",
        chart().to_str().expect("path"),
        "--set-json",
        r#"operator.extraVolumeMounts=[{"name":"prom-token"}]"#,
    ]);
    assert!(!out.status.success(), "a mount without mountPath rendered");
    assert!(text(&out).contains("mountPath"), "{}", text(&out));
}
