//! Keeping secrets out of logs and errors.

/// A connection URL fit for logs and error messages: the password becomes `***` and the query
/// string (which may carry `password=` or tokens) is dropped. Anything that does not look like
/// `scheme://…` becomes `<malformed URL>`, so a typo'd secret is never echoed either.
///
/// ```
/// use palisade_core::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@10.0.0.1:6379/2"), "redis://app:***@10.0.0.1:6379/2");
/// assert_eq!(redact_url("postgres://app@db/app?password=x"), "postgres://app@db/app");
/// assert_eq!(redact_url("s3cret"), "<malformed URL>");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return "<malformed URL>".to_string() };
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = rest.split_once('/').map_or((rest, None), |(a, p)| (a, Some(p)));
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    match path {
        Some(p) => format!("{scheme}://{authority}/{p}"),
        None => format!("{scheme}://{authority}"),
    }
}
