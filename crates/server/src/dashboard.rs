//! The web dashboard (`GET /` and its assets under `/ui/`): three static files compiled into
//! the binary with `include_str!`, so `tally serve` needs no build step, no asset directory
//! and nothing from the internet. The page draws everything it shows from the public `/v1`
//! routes of SPEC §3 — it adds no API of its own — so it works on every backend, and a token
//! limits it exactly as it limits any other client.
//!
//! These routes are outside `/v1`: admission lets them through without a token (the page
//! asks for one itself, and keeps it in the tab's `sessionStorage`), and they read no body
//! and answer only these fixed bytes. Like every route they are in the OpenAPI document
//! (SPEC §3), tagged `dashboard`. A Content-Security-Policy allows only the server's own
//! scripts, styles and requests: no inline script, no third-party origin, no framing.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
const APP_JS: &str = include_str!("../assets/dashboard/app.js");
const STYLE_CSS: &str = include_str!("../assets/dashboard/style.css");

/// Everything the page may load or call: its own origin, nothing inline. `img-src` allows
/// `data:` only for the empty favicon, so the browser does not ask for `/favicon.ico`.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// The dashboard's page.
#[utoipa::path(get, path = "/", tag = "dashboard",
    responses((status = 200, description = "the web dashboard (HTML), built only on the /v1 routes", content_type = "text/html")))]
pub(crate) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// The dashboard's script.
#[utoipa::path(get, path = "/ui/app.js", tag = "dashboard",
    responses((status = 200, description = "the dashboard's script", content_type = "text/javascript")))]
pub(crate) async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

/// The dashboard's style sheet.
#[utoipa::path(get, path = "/ui/style.css", tag = "dashboard",
    responses((status = 200, description = "the dashboard's style sheet", content_type = "text/css")))]
pub(crate) async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

/// One static file with the headers every dashboard answer carries. `no-cache` makes a
/// browser revalidate, so an upgraded server never runs an old script against a new page.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        // No inline script or style (the CSP would block them), and every asset it names
        // is one this module serves.
        assert!(!INDEX_HTML.contains("<script>"), "inline script");
        assert!(!INDEX_HTML.contains("<style"), "inline style");
        assert!(!INDEX_HTML.contains("style=\""), "inline style attribute");
        assert!(INDEX_HTML.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(INDEX_HTML.contains(r#"href="/ui/style.css""#));
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        // The script's one absolute URL is the SVG namespace, which is a name, not a fetch.
        let urls = APP_JS.matches("http://").count() + APP_JS.matches("https://").count();
        assert_eq!(urls, APP_JS.matches("http://www.w3.org/2000/svg").count());
        assert!(
            !APP_JS.contains("innerHTML"),
            "build the DOM from text nodes"
        );
    }
}
