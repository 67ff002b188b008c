//! Settings and the `dynamodb://` URL.

use std::time::Duration;

use palisade_core::{Error, ErrorKind, Result, redact_url};

use crate::BACKEND;

/// Where the store's table is and how patient to be.
///
/// Credentials always come from the AWS SDK's standard chain (environment, profile, web
/// identity, instance metadata); they are never part of the URL or these settings.
#[derive(Clone)]
pub struct DynamoConfig {
    /// The table holding watermarks and records (partition key `pk`, a string). Default:
    /// `palisade`.
    pub table: String,
    /// An endpoint override for a local or compatible server (`http://127.0.0.1:8000`), without
    /// user-info (credentials come from the AWS chain; an `@` is refused). Default: none (the
    /// region's AWS endpoint).
    pub endpoint: Option<String>,
    /// The region. Default: none (the SDK's chain: `AWS_REGION`, profile).
    pub region: Option<String>,
    /// PEM of the CA certificate(s) that signed an `https://` endpoint's certificate (a
    /// private endpoint, a compatible server), trusted instead of the platform's roots. Default:
    /// none (the platform's roots, as for AWS itself).
    pub tls_root_cert: Option<Vec<u8>>,
    /// Create the table at connect if it does not exist (on-demand billing). Default: true.
    pub create_table: bool,
    /// Attempts per request under the SDK's standard retry mode (throttling, 5xx, transient
    /// network errors). Default: 3.
    pub max_attempts: u32,
    /// How long one attempt may take before it is abandoned. Default: 5 s.
    pub attempt_timeout: Duration,
    /// How long a request may take in all, retries included. Default: 15 s.
    pub operation_timeout: Duration,
}

/// The endpoint is shown redacted: a compatible server's URL may carry user-info.
impl std::fmt::Debug for DynamoConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoConfig")
            .field("table", &self.table)
            .field("endpoint", &self.endpoint.as_deref().map(redact_url))
            .field("region", &self.region)
            .field("tls_root_cert", &self.tls_root_cert.as_ref().map(|_| "<set>"))
            .field("create_table", &self.create_table)
            .field("max_attempts", &self.max_attempts)
            .field("attempt_timeout", &self.attempt_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .finish()
    }
}

impl Default for DynamoConfig {
    fn default() -> Self {
        DynamoConfig {
            table: "palisade".to_string(),
            endpoint: None,
            region: None,
            tls_root_cert: None,
            create_table: true,
            max_attempts: 3,
            attempt_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(15),
        }
    }
}

impl DynamoConfig {
    /// Settings for `table` with the defaults above.
    pub fn new(table: impl Into<String>) -> Self {
        DynamoConfig { table: table.into(), ..DynamoConfig::default() }
    }

    /// Trusts the CA certificate(s) in `pem` (PEM) for the `https://` endpoint instead of the
    /// platform's roots.
    pub fn with_tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_cert = Some(pem.into());
        self
    }

    /// Parses `dynamodb://TABLE[?endpoint=URL&region=R&create_table=true|false]`.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::new(
                ErrorKind::InvalidConfig,
                BACKEND,
                format!("{why} (expected dynamodb://TABLE[?endpoint=URL&region=REGION])"),
            )
        };
        let Some(rest) = url.strip_prefix("dynamodb://") else {
            return Err(bad("not a DynamoDB URL".to_string()));
        };
        let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
        if table.contains('@') {
            return Err(bad(
                "user-info (user:password@) in a DynamoDB URL: credentials come from the AWS chain".to_string()
            ));
        }
        let mut config = DynamoConfig::new(table.trim_end_matches('/'));
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            // Never quote a value, nor a name that is not a plain word: a password with a raw
            // '&' or '#' in the endpoint's user-info splits the query at that character.
            let Some((name, value)) = pair.split_once('=') else {
                return Err(bad("a malformed parameter (expected name=value)".to_string()));
            };
            match name {
                "endpoint" => {
                    if !(value.starts_with("http://") || value.starts_with("https://")) {
                        return Err(bad(format!("endpoint {} is not an http(s) URL", redact_url(value))));
                    }
                    config.endpoint = Some(value.to_string());
                }
                "region" if !value.is_empty() => config.region = Some(value.to_string()),
                "create_table" => {
                    config.create_table = match value {
                        "true" => true,
                        "false" => false,
                        _ => return Err(bad("create_table must be true or false".to_string())),
                    }
                }
                _ if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                    return Err(bad(format!("unknown parameter `{name}`")));
                }
                _ => return Err(bad("an unknown parameter".to_string())),
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Refuses settings DynamoDB would refuse later, with a clearer message.
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |m: String| Err(Error::new(ErrorKind::InvalidConfig, BACKEND, m));
        let t = &self.table;
        if t.len() < 3 || t.len() > 255 || !t.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
            // A name with an '@' is user-info written where the table goes: never quote it.
            let name = if t.contains('@') { "(not shown: it holds an '@')".to_string() } else { format!("{t:?}") };
            return invalid(format!("table name {name}: 3–255 characters of a-z, A-Z, 0-9, '_', '-', '.'"));
        }
        // The SDK signs requests with credentials from the AWS chain and ignores user-info in
        // the endpoint, but quotes the endpoint whole in its errors: refuse it, so a password
        // put there by mistake never reaches a message.
        if self.endpoint.as_deref().is_some_and(|e| e.contains('@')) {
            return invalid(
                "the endpoint must not carry user-info (user:password@): DynamoDB credentials come from the AWS chain"
                    .to_string(),
            );
        }
        if let Some(pem) = &self.tls_root_cert {
            if !self.endpoint.as_deref().is_some_and(|e| e.starts_with("https://")) {
                return invalid("a TLS root certificate was given, but the endpoint is not https://".to_string());
            }
            // The SDK panics on a certificate it cannot parse: it is never handed one.
            palisade_core::spi::tls::check_root_certificates(pem).map_err(|why| {
                Error::new(ErrorKind::InvalidConfig, BACKEND, format!("the TLS root certificate: {why}"))
            })?;
        }
        if self.max_attempts == 0 {
            return invalid("max_attempts must be at least 1".to_string());
        }
        if self.attempt_timeout.is_zero() || self.operation_timeout.is_zero() {
            return invalid("timeouts must be above zero".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_certificate_needs_an_https_endpoint_and_must_parse() {
        let https = DynamoConfig { endpoint: Some("https://127.0.0.1:1".into()), ..DynamoConfig::default() };
        let plain = DynamoConfig { endpoint: Some("http://127.0.0.1:1".into()), ..DynamoConfig::default() };
        for bad in [
            https.clone().with_tls_root_cert(b"not pem".to_vec()),
            https
                .clone()
                .with_tls_root_cert(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec()),
            plain.with_tls_root_cert(b"x".to_vec()),
            DynamoConfig::default().with_tls_root_cert(b"x".to_vec()),
        ] {
            assert_eq!(bad.validate().err().map(|e| e.kind()), Some(ErrorKind::InvalidConfig), "{bad:?}");
        }
    }

    #[test]
    fn urls_parse() {
        let c = DynamoConfig::from_url("dynamodb://inventory").unwrap();
        assert_eq!(c.table, "inventory");
        assert!(c.endpoint.is_none() && c.region.is_none() && c.create_table);
        let c = DynamoConfig::from_url(
            "dynamodb://t-1.x?endpoint=http://127.0.0.1:8000&region=eu-west-1&create_table=false",
        )
        .unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert!(!c.create_table);
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in [
            "dynamo://t",
            "dynamodb://",
            "dynamodb://ab",
            "dynamodb://bad table",
            "dynamodb://t12?endpoint=ftp://x",
            "dynamodb://t12?bogus=1",
            "dynamodb://t12?create_table=maybe",
            "dynamodb://t12?region",
            "dynamodb://t12?endpoint=http://u:s3cret@h:1",
            "dynamodb://t12?endpoint=http://u:s3/cret@h:1",
            // User-info where the table goes (found by fuzz/connection_urls): never quoted.
            "dynamodb://app:s3cret@inventory",
            "dynamodb://:s3cret@127.0.0.1:8000",
        ] {
            let err = DynamoConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}");
            assert!(!format!("{err} {err:?}").contains("s3"), "{err:?}");
        }
    }
}
