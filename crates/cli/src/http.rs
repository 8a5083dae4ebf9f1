//! The HTTP side of the client commands, in one place: the routes of SPEC §3 with every path
//! segment and query value percent-encoded ([`Route`]), the base URL and bearer token
//! ([`Client`]), and what comes back — a successful answer kept as the server's JSON and read
//! as a typed answer on demand ([`Answer`]), or an error answer `{"error": {code, message}}`
//! turned into a [`ServerError`].

use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A request's path and query string, each part encoded as it is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    path: String,
    query: Vec<String>,
}

impl Route {
    /// `/v1/ns/{ns}/{what}`: a namespace's `top` or `keys`.
    pub fn namespace(ns: &str, what: &str) -> Route {
        Route {
            path: format!("/v1/ns/{}/{}", enc(ns), enc(what)),
            query: Vec::new(),
        }
    }

    /// A path without variable segments: `/v1/events`, `/healthz`.
    pub fn fixed(path: &'static str) -> Route {
        Route {
            path: path.to_owned(),
            query: Vec::new(),
        }
    }

    /// `/v1/admin/{what}`: an operation on the whole server.
    pub fn admin(what: &str) -> Route {
        Route {
            path: format!("/v1/admin/{}", enc(what)),
            query: Vec::new(),
        }
    }

    /// `/v1/ns/{ns}/keys/{key}/{what}`: one key's `incr`, `series`, `breakdown` …
    pub fn key(ns: &str, key: &str, what: &str) -> Route {
        Route {
            path: format!("/v1/ns/{}/keys/{}/{}", enc(ns), enc(key), enc(what)),
            query: Vec::new(),
        }
    }

    /// Adds `name=value` to the query string.
    pub fn param(mut self, name: &str, value: impl fmt::Display) -> Route {
        self.query
            .push(format!("{}={}", enc(name), enc(&value.to_string())));
        self
    }

    /// Adds `name=value` when there is a value.
    pub fn opt(self, name: &str, value: Option<impl fmt::Display>) -> Route {
        match value {
            Some(v) => self.param(name, v),
            None => self,
        }
    }

    fn path_and_query(&self) -> String {
        if self.query.is_empty() {
            self.path.clone()
        } else {
            format!("{}?{}", self.path, self.query.join("&"))
        }
    }
}

/// Percent-encodes a path segment or a query name or value: everything but RFC 3986's
/// unreserved characters, so a key's `/` stays inside its segment (`%2F`).
fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A connection to one server: its base URL and, when it requires one, a bearer token.
pub struct Client {
    agent: ureq::Agent,
    /// As the user gave it, for messages.
    server: String,
    authorization: Option<String>,
}

/// Leaves the token out: it is a secret.
impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .field("token", &self.authorization.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// The certificates an `https` server's chain must lead to, when given (`--ca-cert`): a
/// server with a private CA or a self-signed certificate. Otherwise Mozilla's roots.
static CA_CERTS: OnceLock<Vec<ureq::tls::Certificate<'static>>> = OnceLock::new();

/// The most a `--ca-cert` file may hold: a bundle of every public root is ~200 KiB.
const MAX_CA_CERT_BYTES: u64 = 4 << 20;

/// Reads `--ca-cert` (PEM, one certificate or more) for every client made after.
pub fn trust_ca_certs(path: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_CERT_BYTES + 1).read_to_end(&mut pem))
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        pem.len() as u64 <= MAX_CA_CERT_BYTES,
        "{}: more than {MAX_CA_CERT_BYTES} bytes, not a certificate file",
        path.display()
    );
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let ureq::tls::PemItem::Certificate(c) =
            item.with_context(|| format!("{}: not PEM", path.display()))?
        {
            certs.push(c);
        }
    }
    anyhow::ensure!(
        !certs.is_empty(),
        "{}: no PEM certificate in it",
        path.display()
    );
    let _ = CA_CERTS.set(certs);
    Ok(())
}

/// `--server`: an `http://` or `https://` URL with a host. Checked before anything is sent,
/// so a missing scheme is not reported as a server that cannot be reached.
pub fn server_url(s: &str) -> Result<String, String> {
    let lower = s.to_ascii_lowercase();
    let host = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"));
    match host {
        Some(h) if !h.is_empty() && !h.starts_with('/') => Ok(s.to_owned()),
        _ => Err(format!(
            "{s:?} is not a server URL: expected http://HOST:PORT or https://HOST:PORT"
        )),
    }
}

/// `--token`: what an `Authorization: Bearer` header can carry to the server's comparison
/// ([`tally_server::config::sendable_token`], the rule the server's config is held to).
/// Checked up front: a newline or a non-ASCII letter made the request fail before it was
/// sent, which read as a server that cannot be reached.
pub fn token(s: &str) -> Result<String, String> {
    if tally_server::config::sendable_token(s) {
        Ok(s.to_owned())
    } else {
        Err("a token is printable ASCII, with no space at either end: no control characters or non-ASCII letters".to_owned())
    }
}

/// "cannot reach the server at …", with a hint when the answer suggests the wrong scheme:
/// rustls reading plain HTTP (an `https://` URL for an http server), or an HTTP parser
/// reading a TLS record (an `http://` URL for an https server).
pub fn unreachable(server: &str, e: ureq::Error) -> anyhow::Error {
    let https = server.to_ascii_lowercase().starts_with("https://");
    let hint = if https && e.to_string().contains("InvalidContentType") {
        " (it answers plain http, not https: use an http:// URL)"
    } else if !https && matches!(e, ureq::Error::Protocol(_)) {
        " (it did not answer in plain http: if it serves https, use an https:// URL)"
    } else {
        ""
    };
    anyhow::Error::new(e).context(format!("cannot reach the server at {server}{hint}"))
}

impl Client {
    pub fn new(server: &str, token: Option<&str>) -> Client {
        Client::with_timeout(server, token, None)
    }

    /// A client whose every request gives up after `timeout` (none: wait as long as it takes).
    pub fn with_timeout(server: &str, token: Option<&str>, timeout: Option<Duration>) -> Client {
        Client {
            // Error statuses are answers too: their body says what went wrong.
            agent: {
                let mut config = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(timeout);
                if let Some(certs) = CA_CERTS.get() {
                    config = config.tls_config(
                        ureq::tls::TlsConfig::builder()
                            .root_certs(ureq::tls::RootCerts::new_with_certs(certs))
                            .build(),
                    );
                }
                config.build().into()
            },
            server: server.to_owned(),
            authorization: token.map(|t| format!("Bearer {t}")),
        }
    }

    pub fn get<T: DeserializeOwned>(&self, route: &Route) -> anyhow::Result<Answer<T>> {
        let mut req = self.agent.get(self.url(route));
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        self.answer(req.call())
    }

    /// A GET whose answer is read by the caller as it streams (any status).
    pub fn get_raw(&self, route: &Route) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let mut req = self.agent.get(self.url(route));
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        req.call().map_err(|e| unreachable(&self.server, e))
    }

    /// A POST of `body` with extra `headers`: the status, the answer's text, and whether the
    /// server said it replayed a remembered answer (`Idempotent-Replayed`).
    pub fn post_body(
        &self,
        route: &Route,
        content_type: &str,
        body: &[u8],
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, String, bool)> {
        let mut req = self
            .agent
            .post(self.url(route))
            .header("Content-Type", content_type);
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req.send(body).map_err(|e| unreachable(&self.server, e))?;
        let status = resp.status().as_u16();
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v.as_bytes() == b"true");
        let text = resp
            .body_mut()
            .read_to_string()
            .context("reading the answer")?;
        Ok((status, text, replayed))
    }

    /// A POST with an empty body (the parameters are in the route).
    pub fn post<T: DeserializeOwned>(&self, route: &Route) -> anyhow::Result<Answer<T>> {
        let mut req = self.agent.post(self.url(route));
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        self.answer(req.send_empty())
    }

    /// A GET whose answer matters only by its status (the load generator's). The body is
    /// read and dropped, so the keep-alive connection is reused.
    pub fn get_status(&self, route: &Route) -> Result<u16, ureq::Error> {
        let mut req = self.agent.get(self.url(route));
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        drain(req.call()?)
    }

    /// A POST of `body` (of type `content_type`) whose answer matters only by its status.
    pub fn post_status(
        &self,
        route: &Route,
        content_type: &str,
        body: &[u8],
    ) -> Result<u16, ureq::Error> {
        let mut req = self
            .agent
            .post(self.url(route))
            .header("Content-Type", content_type);
        if let Some(a) = &self.authorization {
            req = req.header("Authorization", a);
        }
        drain(req.send(body)?)
    }

    fn url(&self, route: &Route) -> String {
        format!(
            "{}{}",
            self.server.trim_end_matches('/'),
            route.path_and_query()
        )
    }

    fn answer<T>(
        &self,
        sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Answer<T>> {
        let mut resp = sent.map_err(|e| unreachable(&self.server, e))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .context("reading the answer")?;
        let json: Value = serde_json::from_str(&text)
            .with_context(|| format!("the server answered {status} with non-JSON: {text}"))?;
        if status >= 400 {
            return Err(ServerError::new(status, json).into());
        }
        Ok(Answer {
            json,
            answer: PhantomData,
        })
    }
}

/// Reads an answer's body to its end and answers its status.
fn drain(mut resp: ureq::http::Response<ureq::Body>) -> Result<u16, ureq::Error> {
    std::io::copy(&mut resp.body_mut().as_reader(), &mut std::io::sink())?;
    Ok(resp.status().as_u16())
}

/// A successful answer. It stays the server's JSON until read as `T`, so `--json` prints
/// exactly what the server said (every field, in its order) and only tables need `T`'s shape.
#[derive(Debug)]
pub struct Answer<T> {
    json: Value,
    answer: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Answer<T> {
    pub fn json(&self) -> &Value {
        &self.json
    }

    pub fn typed(self) -> anyhow::Result<T> {
        serde_json::from_value(self.json).context("the server's answer has an unexpected shape")
    }
}

/// An error answer: `{"error": {"code", "message", "index"?, …}}` with a status of 400 or more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// The 0-based index of the event at fault in a batch of events.
    pub index: Option<usize>,
    /// The answer as the server sent it (`--json` prints it).
    pub body: Value,
}

impl ServerError {
    /// Reads the error body; one of another shape still gives the status.
    pub fn new(status: u16, json: Value) -> ServerError {
        #[derive(Deserialize)]
        struct Body {
            error: Detail,
        }
        #[derive(Deserialize)]
        struct Detail {
            code: Option<String>,
            message: Option<String>,
            index: Option<usize>,
        }
        let detail = serde_json::from_value::<Body>(json.clone())
            .ok()
            .map(|b| b.error);
        let (code, message, index) =
            detail.map_or((None, None, None), |d| (d.code, d.message, d.index));
        ServerError {
            status,
            code: code.unwrap_or_else(|| "error".to_owned()),
            message: message.unwrap_or_default(),
            index,
            body: json,
        }
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (HTTP {})", self.code, self.message, self.status)
    }
}

impl std::error::Error for ServerError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_encode_every_segment_and_value_in_order() {
        let r = Route::key("clicks", "lnk/1 ü", "series")
            .param("from", 0)
            .opt("tz", None::<&str>)
            .opt("dim.country", Some("US|mobile"))
            .param("every", 5);
        assert_eq!(
            r.path_and_query(),
            "/v1/ns/clicks/keys/lnk%2F1%20%C3%BC/series?from=0&dim.country=US%7Cmobile&every=5"
        );
        assert_eq!(
            Route::namespace("api.hits", "keys").path_and_query(),
            "/v1/ns/api.hits/keys"
        );
    }

    #[test]
    fn the_base_url_may_end_in_a_slash() {
        let c = Client::new("http://127.0.0.1:7070/", Some("s3cret"));
        assert_eq!(
            c.url(&Route::namespace("clicks", "top").param("limit", 1)),
            "http://127.0.0.1:7070/v1/ns/clicks/top?limit=1"
        );
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn error_answers_become_one_line_with_code_message_and_status() {
        let e = ServerError::new(
            400,
            serde_json::json!({"error": {"code": "invalid_unit", "message": "unit: bad", "field": "unit"}}),
        );
        assert_eq!(e.to_string(), "invalid_unit: unit: bad (HTTP 400)");
        assert_eq!(e.index, None);
        let e = ServerError::new(
            400,
            serde_json::json!({"error": {"code": "unknown_dimension", "message": "m", "index": 3}}),
        );
        assert_eq!(e.index, Some(3));
        let e = ServerError::new(502, serde_json::json!({"oops": 1}));
        assert_eq!(e.to_string(), "error:  (HTTP 502)");
    }
}
