//! Connection URLs: one parser for the host-list URLs of the backends that take several servers
//! (`etcd://`, `zk://`, `redlock://`), and one redaction for every URL that reaches a message.
//!
//! Both follow the URL standard's split of the authority, so a password means the same thing to
//! every backend: the authority ends at the first `/`, `?` or `#`, the user-info is everything
//! before its last `@`, the user and the password are percent-decoded (`p%40ss` is `p@ss`
//! everywhere, as the Redis and PostgreSQL clients read it). A password that holds `/`, `?`, `#`
//! or `%` must be percent-encoded (`%2F`, `%3F`, `%23`, `%25`); one that is not makes the URL
//! invalid, and the error shows no part of it.

use std::borrow::Cow;

use percent_encoding::percent_decode_str;

/// A connection URL fit for logs and error messages: scheme, hosts, ports and path, **without
/// the user-info** (user and password) and without the query and fragment (which may carry
/// `password=` or tokens).
///
/// It fails closed: a URL that does not parse becomes its scheme alone (`postgres://`), or
/// `<malformed URL>` when not even the scheme can be told, so a mistyped secret is never echoed.
///
/// ```
/// use palisade_core::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@10.0.0.1:6379/2"), "redis://10.0.0.1:6379/2");
/// assert_eq!(redact_url("postgres://app@db/app?password=x"), "postgres://db/app");
/// assert_eq!(redact_url("etcd://u:p%40ss@a:2379,b:2379"), "etcd://a:2379,b:2379");
/// // A raw '/' in the password: the URL is invalid, and nothing of it but the scheme is shown.
/// assert_eq!(redact_url("postgres://app:pa/ss@db/app"), "postgres://");
/// assert_eq!(redact_url("s3cret"), "<malformed URL>");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme) = scheme_of(url) else { return "<malformed URL>".to_string() };
    if let Some(rest) = url[scheme.len() + 1..].strip_prefix("//") {
        // An '@' after the authority is a password with a raw '/', '?' or '#' in it: the part
        // before that character parses as a host (and digits as a port), the rest as a path,
        // query or fragment. Whatever parses, it is the password: show nothing of it.
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if rest[authority_end..].contains('@') {
            return format!("{scheme}://");
        }
        if let Ok(mut parsed) = ::url::Url::parse(url) {
            // These fail only for a URL that cannot hold user-info (an empty host): none to drop.
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            if !parsed.username().is_empty() || parsed.password().is_some() {
                return format!("{scheme}://");
            }
            parsed.set_query(None);
            parsed.set_fragment(None);
            return parsed.to_string();
        }
        // Several hosts (`a:1,b:2`) are not one URL authority; they are one of ours.
        if let Ok(parsed) = ConnectionUrl::parse(url) {
            return parsed.redacted();
        }
        return format!("{scheme}://");
    }
    // No authority (`sqlite::memory:`, `sqlite:file.db`): nothing to hide unless it looks like
    // user-info.
    if url.contains('@') { format!("{scheme}:") } else { url.to_string() }
}

/// The scheme of `url` (letters, digits, `+`, `-`, `.`, starting with a letter), if it has one.
fn scheme_of(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    (first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))).then_some(scheme)
}

/// A parsed `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?name=value&…]`: the
/// form of every backend URL that lists several servers.
///
/// User, password, and query names and values are percent-decoded; hosts are checked (a name, an
/// IPv4 address or a bracketed IPv6 address; a port from 1 to 65535). For backend authors: the
/// `etcd://`, `zk://` and `redlock://` parsers are built on it, so a password reads the same in
/// every backend.
///
/// ```
/// use palisade_core::spi::ConnectionUrl;
/// let u = ConnectionUrl::parse("zk://app:p%40ss@a:2181,[::1]:2182/chroot?session_timeout_ms=500")?;
/// assert_eq!(u.scheme, "zk");
/// assert_eq!((u.user.as_deref(), u.password.as_deref()), (Some("app"), Some("p@ss")));
/// assert_eq!(u.hosts, [("a".to_string(), Some(2181)), ("[::1]".to_string(), Some(2182))]);
/// assert_eq!(u.path, "/chroot");
/// assert_eq!(u.query, [("session_timeout_ms".to_string(), "500".to_string())]);
/// assert_eq!(u.redacted(), "zk://a:2181,[::1]:2182/chroot");
/// assert!(ConnectionUrl::parse("zk://app:pa/ss@a:2181").is_err()); // '/' must be %2F
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionUrl {
    /// The scheme, lowercased.
    pub scheme: String,
    /// The user name, percent-decoded, if the URL has user-info.
    pub user: Option<String>,
    /// The password, percent-decoded, if the user-info has a `:`.
    pub password: Option<String>,
    /// Each host (IPv6 addresses keep their brackets) and its port, if given.
    pub hosts: Vec<(String, Option<u16>)>,
    /// The path, from its `/` (empty when there is none), as written.
    pub path: String,
    /// The query's `name=value` pairs in order, percent-decoded (`+` is a space).
    pub query: Vec<(String, String)>,
}

impl ConnectionUrl {
    /// Parses `url`. The error says what is wrong in words and never quotes the URL (it may hold
    /// a password); callers add [`redact_url`]'s rendering when they want to show which URL.
    pub fn parse(url: &str) -> Result<Self, String> {
        let scheme = scheme_of(url).ok_or("expected SCHEME://…")?;
        let rest = url[scheme.len() + 1..].strip_prefix("//").ok_or("expected SCHEME://…")?;
        if rest.contains('#') {
            return Err("a '#' in the URL (in a password it must be written %23)".to_string());
        }
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, rest) = rest.split_at(end);
        if rest.contains('@') {
            return Err(
                "an '@' after the host list (a password's '/', '?', '#' and '%' must be percent-encoded)".to_string()
            );
        }
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (userinfo, None),
                };
                (Some(decode(user, "user name")?), password.map(|p| decode(p, "password")).transpose()?)
            }
        };
        let hosts = hosts.split(',').map(parse_host).collect::<Result<Vec<_>, _>>()?;
        let query =
            ::url::form_urlencoded::parse(query.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        Ok(ConnectionUrl { scheme: scheme.to_ascii_lowercase(), user, password, hosts, path: path.to_string(), query })
    }

    /// `scheme://host:port,…/path`: no user-info, no query. For logs and errors.
    pub fn redacted(&self) -> String {
        format!("{}://{}{}", self.scheme, self.host_list(), self.path)
    }

    /// The hosts as written back: `host[:port]`, comma-separated.
    pub fn host_list(&self) -> String {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|(host, port)| match port {
                Some(port) => format!("{host}:{port}"),
                None => host.clone(),
            })
            .collect();
        hosts.join(",")
    }

    /// The user-info percent-encoded again (`user:password@`, or empty), for handing the same
    /// credentials to a client that parses URLs itself.
    pub fn encoded_userinfo(&self) -> String {
        encode_userinfo(self.user.as_deref(), self.password.as_deref())
    }
}

/// `user:password@` percent-encoded (`user@`, `:password@` when one is missing, empty when
/// both are), for credentials that do not come from one URL's user-info (a query parameter's,
/// say) handed to a client that parses URLs itself.
pub fn encode_userinfo(user: Option<&str>, password: Option<&str>) -> String {
    use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
    let enc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    match (user, password) {
        (None, None) => String::new(),
        (user, Some(password)) => format!("{}:{}@", user.map(enc).unwrap_or_default(), enc(password)),
        (Some(user), None) => format!("{}@", enc(user)),
    }
}

impl std::fmt::Debug for ConnectionUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionUrl")
            .field("url", &self.redacted())
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("query", &self.query)
            .finish()
    }
}

fn decode(text: &str, what: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded"))
}

fn parse_host(host: &str) -> Result<(String, Option<u16>), String> {
    let (name, port) = if let Some(inner) = host.strip_prefix('[') {
        let (address, after) = inner.split_once(']').ok_or("an IPv6 address without its closing ']'")?;
        address.parse::<std::net::Ipv6Addr>().map_err(|_| "a bracketed host that is not an IPv6 address")?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or("expected ':' and a port after an IPv6 address")?),
        };
        (&host[..address.len() + 2], port)
    } else {
        match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() {
        return Err("an empty host in the list".to_string());
    }
    if !name.starts_with('[') && !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')) {
        return Err("a host name may hold letters, digits, '-', '.' and '_' (a password's '/', '?', '#' and '%' must be percent-encoded)".to_string());
    }
    let port = match port {
        None => None,
        Some(port) => {
            Some(port.parse::<u16>().ok().filter(|p| *p > 0).ok_or("a port must be a number from 1 to 65535")?)
        }
    };
    Ok((name.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_survive_redaction() {
        for (url, shown) in [
            ("postgres://app:pa/ss@db/app", "postgres://"),
            ("postgres://app:pa#ss@db:5432/app", "postgres://"),
            // Digits, then '/': "app:123" parses as a host and port, the rest as a path.
            ("postgresql://app:123/Qu5fo@lc9W@127.0.0.1:45657/app", "postgresql://"),
            ("postgres://app:123?x=Qu5fo@127.0.0.1:1/app", "postgres://"),
            ("postgres://app:123#Qu5fo@127.0.0.1:1/app", "postgres://"),
            ("redis://:pa?ss@h:6379", "redis://"),
            ("redis://:pa%3Fss@h:6379", "redis://h:6379"),
            ("redis://u:p@ss@h:6379/0", "redis://h:6379/0"),
            ("etcd://u:s3cret@a:1,b:2", "etcd://a:1,b:2"),
            ("etcds://u:s%2F3cret@a:1", "etcds://a:1"),
            ("zk://u:s3cret@a:1,b:2/chroot?root=/x", "zk://a:1,b:2/chroot"),
            ("redlock://u:s3cret@a:1,b:2/0?x=1", "redlock://a:1,b:2/0"),
            ("dynamodb://table?endpoint=http://u:s3cret@h:1", "dynamodb://"),
            ("dynamodb://table?endpoint=http://h:1", "dynamodb://table"),
            ("sqlite://warehouse.db", "sqlite://warehouse.db"),
            ("sqlite:///var/x.db?synchronous=full", "sqlite:///var/x.db"),
            ("sqlite::memory:", "sqlite::memory:"),
            ("sqlite:u:s3cret@x", "sqlite:"),
            ("s3cret", "<malformed URL>"),
            ("", "<malformed URL>"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn user_and_password_are_percent_decoded_once() {
        let u = ConnectionUrl::parse("etcd://us%3Aer:p%40ss%2F%25@h:1").unwrap();
        assert_eq!((u.user.as_deref(), u.password.as_deref()), (Some("us:er"), Some("p@ss/%")));
        assert_eq!(u.encoded_userinfo(), "us%3Aer:p%40ss%2F%25@");
        assert_eq!(encode_userinfo(None, Some("p@ss")), ":p%40ss@");
        assert_eq!(encode_userinfo(Some("u"), None), "u@");
        assert_eq!(encode_userinfo(None, None), "");
        assert_eq!(ConnectionUrl::parse(&format!("etcd://{}h:1", u.encoded_userinfo())).unwrap(), u);
        // An '@' in the password works without encoding: the user-info ends at the last one.
        let u = ConnectionUrl::parse("zk://u:p@ss@h:1").unwrap();
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(ConnectionUrl::parse("zk://u@h").unwrap().password, None);
    }

    #[test]
    fn bad_hosts_are_refused_without_quoting_the_url() {
        for url in
            ["etcd://u:Zq/9x@h:1", "etcd://h:0", "etcd://h:x", "etcd://a:1,,b:2", "etcd://[::1", "zk://u:Zq#9x@h:1"]
        {
            let e = ConnectionUrl::parse(url).unwrap_err();
            assert!(!e.contains("Zq") && !e.contains("9x"), "{url}: {e}");
        }
        let u = ConnectionUrl::parse("etcd://[::1]:2379,h").unwrap();
        assert_eq!(u.hosts, [("[::1]".to_string(), Some(2379)), ("h".to_string(), None)]);
    }
}
