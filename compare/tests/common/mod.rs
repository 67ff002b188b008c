//! What the command-line tests share.

/// The URL of database `name` on the server of the PostgreSQL URL `admin`: its path replaced,
/// its credentials and query kept.
pub fn database_url(admin: &str, name: &str) -> String {
    let (base, query) = admin.split_once('?').map_or((admin, None), |(b, q)| (b, Some(q)));
    let authority_at = base.find("://").map_or(0, |i| i + 3);
    let server = base[authority_at..].find('/').map_or(base, |i| &base[..authority_at + i]);
    format!("{server}/{name}{}", query.map(|q| format!("?{q}")).unwrap_or_default())
}

#[test]
fn a_database_url_keeps_the_server_and_the_query() {
    assert_eq!(
        database_url("postgres://u:p@h:5432/postgres?sslmode=disable", "d"),
        "postgres://u:p@h:5432/d?sslmode=disable"
    );
    assert_eq!(database_url("postgres://h:5432", "d"), "postgres://h:5432/d");
}
