//! The dashboard's routes: served without a token even when tokens are configured (the page
//! asks for one), static bytes with a Content-Security-Policy of the server's own origin,
//! JSON errors around them as everywhere, and in the OpenAPI document like every route. What the
//! page shows is tested in a real browser by crates/cli/tests/cli/dashboard.rs.

use crate::Server;
use crate::errors::raw_http;

fn head_and_body(s: &Server, path: &str) -> (String, String) {
    let answer = raw_http(
        s.addr,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.to_ascii_lowercase(), body.to_owned())
}

#[test]
fn the_dashboard_needs_no_token_and_allows_only_its_own_origin() {
    let s = Server::with_config("[[tokens]]\ntoken = \"s3cret\"\nscopes = [\"read:*\"]\n");
    for (path, ctype, needle) in [
        (
            "/",
            "text/html",
            r#"<script src="/ui/app.js" defer></script>"#,
        ),
        ("/ui/app.js", "text/javascript", "sessionStorage"),
        ("/ui/style.css", "text/css", "@media (max-width: 600px)"),
    ] {
        let (head, body) = head_and_body(&s, path);
        assert!(head.starts_with("http/1.1 200"), "{path}: {head}");
        assert!(
            head.contains(&format!("content-type: {ctype}")),
            "{path}: {head}"
        );
        assert!(
            head.contains("content-security-policy: default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self';"),
            "{path}: {head}"
        );
        assert!(head.contains("x-content-type-options: nosniff"), "{head}");
        assert!(body.contains(needle), "{path}");
    }
    // The API itself still wants the token.
    crate::err(s.get("/v1/ns"), 401, "unauthorized");
    // An unknown asset is the API's JSON 404.
    let (head, body) = head_and_body(&s, "/ui/nothing.js");
    assert!(head.starts_with("http/1.1 404"), "{head}");
    assert!(body.contains(r#""code":"not_found""#), "{body}");
}

/// SPEC §3: the OpenAPI document covers every route, the dashboard's too.
#[test]
fn the_dashboard_is_in_the_openapi_document() {
    let s = Server::start(tally_server::Settings::default());
    let (status, doc) = s.get("/openapi.json");
    assert_eq!(status, 200);
    let paths = doc["paths"].as_object().unwrap();
    for (path, ctype) in [
        ("/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        let op = &paths[path]["get"];
        assert_eq!(op["tags"][0], "dashboard", "{path}: {op}");
        assert!(
            op["responses"]["200"]["content"].get(ctype).is_some(),
            "{path}: {op}"
        );
    }
}
