//! URLs as Kubernetes' CEL URL library reads them: `isURL(s)` and `url(s)` accept what Go's
//! `net/url.ParseRequestURI` accepts (an absolute URL or an absolute path), and the accessors
//! (`getScheme`, `getHost`, `getHostname`, `getPort`, `getEscapedPath`) return what Go's `url.URL`
//! returns. This is a port of the parts of `net/url` those functions reach.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A parsed URL: the parts the CEL accessors return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    scheme: String,
    host: String,
    path: Vec<u8>,
    raw_path: String,
}

/// Why a string is not a URL, in `net/url`'s words (without its `parse "...": ` prefix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UrlError(String);

fn err<T>(message: impl Into<String>) -> Result<T, UrlError> {
    Err(UrlError(message.into()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    Zone,
    UserPassword,
    Fragment,
}

impl Url {
    /// `url.ParseRequestURI` (which decides validity), then `url.Parse` (which decides the parts,
    /// as the Kubernetes library does because the former mishandles fragments).
    pub fn parse(text: &str) -> Result<Url, UrlError> {
        parse(text, true)?;
        let (without_fragment, fragment) = match text.split_once('#') {
            Some((u, f)) => (u, Some(f)),
            None => (text, None),
        };
        let url = parse(without_fragment, false)?;
        if let Some(f) = fragment {
            unescape(f.as_bytes(), Mode::Fragment)?;
        }
        Ok(url)
    }

    /// The scheme, lower-cased.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// Host and port, as written (`example.com:8080`, `[::1]:80`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The host without port and without IPv6 brackets.
    pub fn hostname(&self) -> &str {
        split_host_port(&self.host).0
    }

    /// The port, or empty.
    pub fn port(&self) -> &str {
        split_host_port(&self.host).1
    }

    /// The path, escaped (`URL.EscapedPath`).
    pub fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty()
            && valid_encoded(self.raw_path.as_bytes())
            && unescape(self.raw_path.as_bytes(), Mode::Path).is_ok_and(|p| p == self.path)
        {
            return self.raw_path.clone();
        }
        if self.path == b"*" {
            return "*".into();
        }
        escape(&self.path, Mode::Path)
    }
}

fn parse(raw: &str, via_request: bool) -> Result<Url, UrlError> {
    if raw.bytes().any(|b| b < b' ' || b == 0x7f) {
        return err("net/url: invalid control character in URL");
    }
    if raw.is_empty() && via_request {
        return err("empty url");
    }
    let mut url =
        Url { scheme: String::new(), host: String::new(), path: Vec::new(), raw_path: String::new() };
    if raw == "*" {
        url.path = b"*".to_vec();
        return Ok(url);
    }
    let (scheme, mut rest) = get_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        rest = &rest[..rest.len() - 1];
    } else if let Some((before, _query)) = rest.split_once('?') {
        rest = before;
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            // A rootless path with a scheme is opaque: no host, no path.
            return Ok(url);
        }
        if via_request {
            return err("invalid URI for request");
        }
        if rest.split('/').next().is_some_and(|segment| segment.contains(':')) {
            return err("first path segment in URL cannot contain colon");
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///")) && rest.starts_with("//") {
        let authority_and_path = &rest[2..];
        let (authority, path) = match authority_and_path.find('/') {
            Some(i) => authority_and_path.split_at(i),
            None => (authority_and_path, ""),
        };
        url.host = parse_authority(&url.scheme, authority)?;
        rest = path;
    }
    url.path = unescape(rest.as_bytes(), Mode::Path)?;
    if escape(&url.path, Mode::Path) != rest {
        url.raw_path = rest.to_string();
    }
    Ok(url)
}

fn get_scheme(raw: &str) -> Result<(&str, &str), UrlError> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' => {
                if i == 0 {
                    return Ok(("", raw));
                }
            }
            b':' => {
                if i == 0 {
                    return err("missing protocol scheme");
                }
                return Ok((&raw[..i], &raw[i + 1..]));
            }
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

fn parse_authority(scheme: &str, authority: &str) -> Result<String, UrlError> {
    let (userinfo, host) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let host = parse_host(scheme, host)?;
    if let Some(userinfo) = userinfo {
        if !userinfo.chars().all(|r| r.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(r)) {
            return err("net/url: invalid userinfo");
        }
        for part in userinfo.splitn(2, ':') {
            unescape(part.as_bytes(), Mode::UserPassword)?;
        }
    }
    Ok(host)
}

fn parse_host(scheme: &str, host: &str) -> Result<String, UrlError> {
    match host.rfind('[') {
        Some(i) if i > 0 => return err("invalid IP-literal"),
        Some(_) => {
            let close = host.rfind(']').ok_or_else(|| UrlError("missing ']' in host".into()))?;
            let colon_port = &host[close + 1..];
            if !valid_optional_port(colon_port) {
                return err(format!("invalid port {} after host", go_quote(colon_port)));
            }
            let hostname = &host[1..close];
            let unescaped = match hostname.find("%25") {
                Some(zone) => {
                    let mut h = unescape(&hostname.as_bytes()[..zone], Mode::Host)?;
                    h.extend(unescape(&hostname.as_bytes()[zone..], Mode::Zone)?);
                    h
                }
                None => unescape(hostname.as_bytes(), Mode::Host)?,
            };
            let unescaped = String::from_utf8_lossy(&unescaped).into_owned();
            let address = unescaped.split('%').next().unwrap_or_default();
            if address.parse::<Ipv4Addr>().is_ok() {
                return err("invalid IP-literal");
            }
            if address.parse::<Ipv6Addr>().is_err() {
                return err(format!("invalid host: ParseAddr({}): unable to parse IP", go_quote(&unescaped)));
            }
            return Ok(format!("[{unescaped}]{colon_port}"));
        }
        None => {}
    }
    if let Some(first) = host.find(':') {
        // Go is strict about extra colons only for http and https.
        let i = if scheme == "http" || scheme == "https" { first } else { host.rfind(':').unwrap_or(first) };
        let colon_port = &host[i..];
        if !valid_optional_port(colon_port) {
            return err(format!("invalid port {} after host", go_quote(colon_port)));
        }
    }
    Ok(String::from_utf8_lossy(&unescape(host.as_bytes(), Mode::Host)?).into_owned())
}

fn valid_optional_port(port: &str) -> bool {
    port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

fn split_host_port(host_port: &str) -> (&str, &str) {
    let (mut host, mut port) = (host_port, "");
    if let Some(colon) = host_port.rfind(':')
        && valid_optional_port(&host_port[colon..])
    {
        (host, port) = (&host_port[..colon], &host_port[colon + 1..]);
    }
    if host.starts_with('[') && host.ends_with(']') && host.len() >= 2 {
        host = &host[1..host.len() - 1];
    }
    (host, port)
}

fn unhex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

fn unescape(s: &[u8], mode: Mode) -> Result<Vec<u8>, UrlError> {
    let escape_error = |at: usize| {
        let end = (at + 3).min(s.len());
        UrlError(format!("invalid URL escape {}", go_quote(&String::from_utf8_lossy(&s[at..end]))))
    };
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                if i + 2 >= s.len() || !s[i + 1].is_ascii_hexdigit() || !s[i + 2].is_ascii_hexdigit() {
                    return Err(escape_error(i));
                }
                if mode == Mode::Host && unhex(s[i + 1]) < 8 && &s[i..i + 3] != b"%25" {
                    return Err(escape_error(i));
                }
                if mode == Mode::Zone {
                    let v = (unhex(s[i + 1]) << 4) | unhex(s[i + 2]);
                    if &s[i..i + 3] != b"%25" && v != b' ' && should_escape(v, Mode::Host) {
                        return Err(escape_error(i));
                    }
                }
                i += 3;
            }
            c => {
                if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && should_escape(c, mode) {
                    return err(format!(
                        "invalid character {} in host name",
                        go_quote(&char::from(c).to_string())
                    ));
                }
                i += 1;
            }
        }
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            out.push((unhex(s[i + 1]) << 4) | unhex(s[i + 2]));
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if matches!(mode, Mode::Host | Mode::Zone) && b"!$&'()*+,;=:[]<>\"".contains(&c) {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => return false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => return c == b'?',
            Mode::UserPassword => return matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::Fragment => return false,
            Mode::Host | Mode::Zone => {}
        },
        _ => {}
    }
    if mode == Mode::Fragment && matches!(c, b'!' | b'(' | b')' | b'*') {
        return false;
    }
    true
}

fn escape(s: &[u8], mode: Mode) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s {
        if should_escape(c, mode) {
            out.push_str(&format!("%{c:02X}"));
        } else {
            out.push(char::from(c));
        }
    }
    out
}

fn valid_encoded(s: &[u8]) -> bool {
    s.iter().all(|&c| b"!$&'()*+,;=:@[]%".contains(&c) || !should_escape(c, Mode::Path))
}

/// Go's `%q` of a string: double-quoted with Go escapes.
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn accepts_what_parse_request_uri_accepts() {
        for ok in [
            "https://models.example.com/smol.gguf",
            "http://10.0.0.1:8080/m.gguf?x=1",
            "https://user:pa%20ss@example.com/",
            "https://[::1]:443/a",
            "/absolute/path",
            "mailto:someone@example.com",
            "https://example.com/a#frag",
            "*",
            "ftp://x",
            "https://",
        ] {
            assert!(Url::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "relative/path",
            "example.com",
            "://x",
            "https://exa mple.com/",
            "https://example.com:80a/",
            "https://a:1:2/",
            "https://[1.2.3.4]/",
            "https://[::1/",
            "https://x/%zz",
            "https://x/\n",
            "https://ex%41mple.com/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn accessors_return_what_go_returns() {
        let u = url("HTTPS://Models.Example.com:8443/a%20b/c?q=1#top");
        assert_eq!(u.scheme(), "https");
        assert_eq!(u.host(), "Models.Example.com:8443");
        assert_eq!(u.hostname(), "Models.Example.com");
        assert_eq!(u.port(), "8443");
        assert_eq!(u.escaped_path(), "/a%20b/c");
        let v6 = url("https://[fe80::1]:80/");
        assert_eq!((v6.hostname(), v6.port(), v6.host()), ("fe80::1", "80", "[fe80::1]:80"));
        let bare = url("https:///path");
        assert_eq!((bare.hostname(), bare.escaped_path().as_str()), ("", "/path"));
        assert_eq!(url("mailto:a@b").hostname(), "");
        assert_eq!(url("https://x/a b").escaped_path(), "/a%20b");
        assert_eq!(url("https://x/a%2Fb").escaped_path(), "/a%2Fb");
        assert_eq!(url("https://x").escaped_path(), "");
    }

    #[test]
    fn quotes_like_go() {
        assert_eq!(go_quote("a\"b\\c\n"), r#""a\"b\\c\n""#);
        assert_eq!(go_quote("é"), "\"é\"");
    }
}
