//! The chart README's table of values, generated from `values.yaml`'s `# --` comments (the
//! helm-docs convention): one row per documented key, with its default as YAML and its
//! description. The README holds the table between two markers; a test compares them, and
//! `PACER_BLESS=1` rewrites it.

/// Where the table sits in the README.
pub const BEGIN: &str = "<!-- values:begin (generated from values.yaml; PACER_BLESS=1 cargo test -p pacer-operator --test chart) -->";
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
