//! How a StatsD metric name and its tags become a namespace, a key and dimensions.
//!
//! `[statsd]`'s `namespace`, `key` and `dimensions` are the default rule; each `[[statsd.map]]`
//! rule applies instead to the metric names that start with its `prefix` (the first matching
//! rule wins, in file order):
//!
//! ```toml
//! [statsd]
//! namespace = "statsd"          # default "statsd"
//! key = "{name}"                # default: the metric name is the key
//! # dimensions = ["status"]     # default: every tag (but those the key uses)
//!
//! [[statsd.map]]
//! prefix = "api."               # api.hits:1|c|#org:42,status:200
//! namespace = "api"             #   → namespace api,
//! key = "{rest}.{tag:org}"      #   → key "hits.42",
//! dimensions = ["status"]       #   → dimension status=200; other tags are ignored
//! ```
//!
//! A key template is literal text with placeholders: `{name}` (the whole metric name), `{rest}`
//! (the name after the rule's prefix) and `{tag:T}` (the value of the line's first tag `T`; a
//! line without it is dropped as `invalid`). `{{` and `}}` are literal braces. The key it
//! renders is then checked by the API's rules like any key.
//!
//! `dimensions` chooses which tags become dimensions: a list keeps those tags and ignores the
//! others (a tag without a value is ignored too, unless listed); without a list, every tag but
//! those the key template uses becomes one. Either way the namespace's allow-list still applies.

use tally_core::model::{DimName, Namespace};

/// The rules, checked once when the configuration is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    rules: Vec<Rule>,
    fallback: Rule,
}

/// One rule: the names it takes, and where their lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Names starting with this (empty: every name).
    pub prefix: String,
    pub namespace: String,
    pub key: KeyTemplate,
    /// The tags that become dimensions; None: every tag the key does not use.
    pub dimensions: Option<Vec<String>>,
}

impl Rule {
    /// Checks a rule's parts; the error names the part.
    pub fn new(
        prefix: &str,
        namespace: &str,
        key: &str,
        dimensions: Option<Vec<String>>,
    ) -> Result<Rule, (&'static str, String)> {
        Namespace::new(namespace).map_err(|e| ("namespace", e.to_string()))?;
        let key = KeyTemplate::parse(key).map_err(|e| ("key", e))?;
        if let Some(dims) = &dimensions {
            for d in dims {
                DimName::new(d).map_err(|e| ("dimensions", e.to_string()))?;
            }
        }
        Ok(Rule {
            prefix: prefix.to_owned(),
            namespace: namespace.to_owned(),
            key,
            dimensions,
        })
    }

    /// Whether this rule's `dimensions` list names `name` (a rule without a list names
    /// none).
    pub fn lists_tag(&self, name: &str) -> bool {
        self.dimensions
            .as_ref()
            .is_some_and(|list| list.iter().any(|d| d == name))
    }

    /// Whether tag `name` becomes a dimension under this rule.
    pub fn keeps_tag(&self, name: &str) -> bool {
        match &self.dimensions {
            Some(list) => list.iter().any(|d| d == name),
            None => !self.key.uses_tag(name),
        }
    }
}

impl Default for Mapping {
    /// Every line into namespace `statsd`, the metric name as the key, every tag a dimension.
    fn default() -> Mapping {
        Mapping::single(crate::statsd::DEFAULT_NAMESPACE)
    }
}

impl Mapping {
    pub fn new(fallback: Rule, rules: Vec<Rule>) -> Mapping {
        Mapping { rules, fallback }
    }

    /// Every line into namespace `ns` (a valid name), the metric name as the key, every tag a
    /// dimension.
    pub fn single(ns: &str) -> Mapping {
        Mapping {
            rules: Vec::new(),
            fallback: Rule {
                prefix: String::new(),
                namespace: ns.to_owned(),
                key: KeyTemplate(vec![Part::Name]),
                dimensions: None,
            },
        }
    }

    /// The rule for metric `name`.
    pub fn rule(&self, name: &str) -> &Rule {
        self.rules
            .iter()
            .find(|r| name.starts_with(r.prefix.as_str()))
            .unwrap_or(&self.fallback)
    }

    /// The default rule (`[statsd]`'s own fields).
    pub fn fallback(&self) -> &Rule {
        &self.fallback
    }

    /// Every namespace a line can go to, for the start-up log.
    pub fn namespaces(&self) -> Vec<&str> {
        let mut out: Vec<&str> = std::iter::once(&self.fallback)
            .chain(&self.rules)
            .map(|r| r.namespace.as_str())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// A key template: `{name}`, `{rest}`, `{tag:T}` and literal text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyTemplate(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Name,
    Rest,
    Tag(String),
}

/// A key template is at most this long (a key is at most 256 bytes).
const MAX_TEMPLATE_BYTES: usize = 1024;

impl KeyTemplate {
    pub fn parse(s: &str) -> Result<KeyTemplate, String> {
        if s.len() > MAX_TEMPLATE_BYTES {
            return Err(format!(
                "a key template is at most {MAX_TEMPLATE_BYTES} bytes"
            ));
        }
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '}' => return Err(format!("{s:?}: a lone '}}' (write '}}}}' for a brace)")),
                '{' => {
                    let mut inner = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => inner.push(c),
                            None => return Err(format!("{s:?}: '{{' is never closed")),
                        }
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(match inner.as_str() {
                        "name" => Part::Name,
                        "rest" => Part::Rest,
                        _ => match inner.strip_prefix("tag:") {
                            Some(t) => {
                                DimName::new(t).map_err(|e| format!("{s:?}: {{tag:{t}}}: {e}"))?;
                                Part::Tag(t.to_owned())
                            }
                            None => {
                                return Err(format!(
                                    "{s:?}: unknown placeholder {{{inner}}} (expected {{name}}, \
                                     {{rest}} or {{tag:T}})"
                                ));
                            }
                        },
                    });
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        if parts.is_empty() {
            return Err("the key template is empty".into());
        }
        Ok(KeyTemplate(parts))
    }

    fn uses_tag(&self, name: &str) -> bool {
        self.0
            .iter()
            .any(|p| matches!(p, Part::Tag(t) if t == name))
    }

    /// The key for metric `name` (with `rest` after the rule's prefix) and the line's `tags`;
    /// the error names a tag the line lacks.
    pub fn render(&self, name: &str, rest: &str, tags: &[(&str, &str)]) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Name => out.push_str(name),
                Part::Rest => out.push_str(rest),
                Part::Tag(t) => match tags.iter().find(|(k, _)| k == t) {
                    Some((_, v)) => out.push_str(v),
                    None => {
                        return Err(format!(
                            "the key is built from tag {t:?}, which the line does not carry"
                        ));
                    }
                },
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn rule(prefix: &str, ns: &str, key: &str, dims: Option<&[&str]>) -> Rule {
        Rule::new(
            prefix,
            ns,
            key,
            dims.map(|d| d.iter().map(|s| (*s).to_owned()).collect()),
        )
        .unwrap()
    }

    #[test]
    fn templates_render_names_rests_and_tags() {
        let t = KeyTemplate::parse("{rest}.{tag:org}").unwrap();
        assert_eq!(
            t.render("api.hits", "hits", &[("org", "42"), ("org", "7")]),
            Ok("hits.42".into())
        );
        let t = KeyTemplate::parse("x{{{name}}}").unwrap();
        assert_eq!(t.render("a", "", &[]), Ok("x{a}".into()));
        let err = KeyTemplate::parse("{tag:org}")
            .unwrap()
            .render("a", "a", &[("env", "p")])
            .unwrap_err();
        assert!(err.contains("\"org\""), "{err}");
    }

    #[test]
    fn bad_templates_say_why() {
        for (t, why) in [
            ("", "empty"),
            ("{nam}", "unknown placeholder {nam}"),
            ("{name", "never closed"),
            ("a}b", "lone '}'"),
            ("{tag:Bad Dim}", "{tag:Bad Dim}"),
            ("{tag:}", "{tag:}"),
        ] {
            let err = KeyTemplate::parse(t).unwrap_err();
            assert!(err.contains(why), "{t}: {err}");
        }
        assert!(KeyTemplate::parse(&"x".repeat(1025)).is_err());
    }

    #[test]
    fn the_first_matching_prefix_wins_else_the_default() {
        let m = Mapping::new(
            rule("", "statsd", "{name}", None),
            vec![
                rule("api.v2.", "api2", "{rest}", None),
                rule("api.", "api", "{rest}", Some(&["status"])),
            ],
        );
        assert_eq!(m.rule("api.v2.hits").namespace, "api2");
        assert_eq!(m.rule("api.hits").namespace, "api");
        assert_eq!(m.rule("web.hits").namespace, "statsd");
        assert_eq!(m.namespaces(), vec!["api", "api2", "statsd"]);
    }

    #[test]
    fn dimensions_keep_listed_tags_or_all_the_key_does_not_use() {
        let all = rule("", "s", "{tag:org}", None);
        assert!(all.keeps_tag("status"));
        assert!(!all.keeps_tag("org"));
        let listed = rule("", "s", "{tag:org}", Some(&["org", "status"]));
        assert!(listed.keeps_tag("org"));
        assert!(!listed.keeps_tag("env"));
    }

    #[test]
    fn bad_rules_name_the_field() {
        assert_eq!(
            Rule::new("", "Bad NS", "{name}", None).unwrap_err().0,
            "namespace"
        );
        assert_eq!(Rule::new("", "ok", "{x}", None).unwrap_err().0, "key");
        assert_eq!(
            Rule::new("", "ok", "{name}", Some(vec!["Bad Dim".into()]))
                .unwrap_err()
                .0,
            "dimensions"
        );
    }
}
