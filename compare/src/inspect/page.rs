//! `palisade inspect --serve ADDR`: the same view as a web page that refreshes itself, for a
//! screen on the wall during an incident. Read-only: it answers `GET` only, and reads the
//! lock service and the stores once per refresh interval whoever is watching (one reader in
//! the background), so a room full of browsers puts no more load on the servers than one.
//!
//! Rendered on the server: the page's one script (bundled in the binary, no build step) only
//! fetches the rendered view again and swaps it in. Without scripts the page reloads itself.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use palisade::Fence;
use tokio::sync::watch;

use super::{Snapshot, Views, waiters_text};

/// A lock with less time left than this, or than two refresh intervals, is shown as near
/// its expiry: a holder that has stopped extending is about to lose it.
const NEAR_EXPIRY: Duration = Duration::from_secs(2);

/// The last read of the lock service and the stores.
struct Reading {
    /// When it was read (the wall clock, shown as UTC).
    at: SystemTime,
    /// The last view read, and when: kept through a failed read, which shows beside it.
    view: Option<(SystemTime, Snapshot)>,
    /// Why the last read failed, if it did (already free of credentials: the URLs are
    /// redacted, and errors carry no owner token).
    error: Option<String>,
}

struct Page {
    readings: watch::Receiver<Arc<Reading>>,
    every: Duration,
}

/// Serves the view on `listener` until Ctrl-C: exit 0 then, 3 if serving fails.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    views: Views,
    one: Option<palisade::ResourceKey>,
    prefix: String,
    every: Duration,
) -> std::process::ExitCode {
    let bound = listener.local_addr().map_or_else(|_| "its address".to_string(), |a| a.to_string());
    let first = read(&views, one.as_ref(), &prefix).await;
    let (send, readings) = watch::channel(Arc::new(first));
    // One reader for every viewer, stopped with the server.
    let reader = tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let mut next = read(&views, one.as_ref(), &prefix).await;
            if next.view.is_none() {
                // Keep the last good view beside a failed read.
                next.view = send.borrow().view.clone();
            }
            if send.send(Arc::new(next)).is_err() {
                return;
            }
        }
    });
    let app = router(Arc::new(Page { readings, every }));
    let loopback = listener.local_addr().is_ok_and(|a: SocketAddr| a.ip().is_loopback());
    eprintln!(
        "palisade inspect: serving http://{bound}/ (read-only, refreshed every {:.1} s; Ctrl-C stops)",
        every.as_secs_f64()
    );
    if !loopback {
        eprintln!(
            "palisade inspect: the page has no authentication: anyone who reaches {bound} sees the resource names and grant ids"
        );
    }
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    reader.abort();
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("palisade inspect: the page's server stopped: {e}");
            std::process::ExitCode::from(3)
        }
    }
}

async fn read(views: &Views, one: Option<&palisade::ResourceKey>, prefix: &str) -> Reading {
    let at = SystemTime::now();
    match views.snapshot(one, prefix).await {
        Ok(snapshot) => Reading { at, view: Some((at, snapshot)), error: None },
        Err(e) => Reading { at, view: None, error: Some(e.report().to_string()) },
    }
}

fn router(page: Arc<Page>) -> Router {
    Router::new()
        .route("/", get(whole))
        .route("/view", get(fragment))
        .route("/view.json", get(as_json))
        .route("/page.js", get(|| async { asset("text/javascript; charset=utf-8", include_str!("page.js")) }))
        .route("/page.css", get(|| async { asset("text/css; charset=utf-8", include_str!("page.css")) }))
        .with_state(page)
}

/// Headers every answer carries: never cached (it is a view of now), never sniffed, and no
/// script or style from anywhere but this server.
fn fresh(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'self'"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    fresh(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

async fn whole(State(page): State<Arc<Page>>) -> Response {
    let reading = Arc::clone(&page.readings.borrow());
    fresh(Html(render_page(&reading, page.every)).into_response())
}

async fn fragment(State(page): State<Arc<Page>>) -> Response {
    let reading = Arc::clone(&page.readings.borrow());
    fresh(Html(render_view(&reading, page.every)).into_response())
}

async fn as_json(State(page): State<Arc<Page>>) -> Response {
    let reading = Arc::clone(&page.readings.borrow());
    let body = match (&reading.view, &reading.error) {
        (Some((_, view)), None) => view.to_json(),
        (view, error) => serde_json::json!({
            "error": error,
            "last": view.as_ref().map(|(_, v)| v.to_json()),
        }),
    };
    fresh(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

/// The whole page: the view inside its frame.
fn render_page(reading: &Reading, every: Duration) -> String {
    let mut out = String::with_capacity(4096);
    let refresh_s = every.as_secs().max(1);
    let title = match &reading.view {
        Some((_, view)) => format!("palisade inspect: {}", view.lock.0),
        None => "palisade inspect".to_string(),
    };
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><link rel=\"stylesheet\" href=\"page.css\">\
         <noscript><meta http-equiv=\"refresh\" content=\"{refresh_s}\"></noscript></head>\n<body>\n\
         <main id=\"view\" data-refresh-ms=\"{}\">",
        escape(&title),
        every.as_millis(),
    );
    out.push_str(&render_view(reading, every));
    out.push_str("</main>\n<script src=\"page.js\"></script>\n</body></html>\n");
    out
}

/// The view: what the page's script swaps in at each refresh.
fn render_view(reading: &Reading, every: Duration) -> String {
    let mut out = String::with_capacity(4096);
    let near = NEAR_EXPIRY.max(every * 2);
    if let Some(error) = &reading.error {
        let _ = write!(
            out,
            "<p class=\"error\" role=\"alert\">Could not read at {}: {}{}</p>",
            utc(reading.at),
            escape(error),
            if reading.view.is_some() { " (the view below is older)" } else { "" }
        );
    }
    let Some((at, view)) = &reading.view else { return out };
    let warnings = view.warnings();
    let _ = write!(
        out,
        "<header><h1>palisade inspect</h1><p>lock service: <b>{}</b> ({})",
        escape(view.lock.0),
        escape(&view.lock.1)
    );
    for (backend, url) in &view.stores {
        let _ = write!(out, " · store: <b>{}</b> ({})", escape(backend), escape(url));
    }
    let _ = write!(
        out,
        "</p><p class=\"status\">read at <time>{}</time> UTC · {} resource{} · <span class=\"{}\">{} warning{}</span></p></header>",
        utc(*at),
        view.rows.len(),
        if view.rows.len() == 1 { "" } else { "s" },
        if warnings > 0 { "count-warn" } else { "count-ok" },
        warnings,
        if warnings == 1 { "" } else { "s" },
    );
    if view.rows.is_empty() {
        out.push_str("<p class=\"empty\">no resource found</p>");
        return out;
    }
    out.push_str(
        "<table><thead><tr><th>resource</th><th>lock</th><th>holder's fence</th><th>time left</th>\
         <th>fence counter</th><th>waiters</th><th>store watermarks</th></tr></thead><tbody>",
    );
    for row in &view.rows {
        let lock = &row.lock;
        let row_warnings = row.warnings();
        let expiring = lock.holder.as_ref().and_then(|h| h.expires_in).is_some_and(|left| left <= near);
        let mut classes = vec![if lock.holder.is_some() { "held" } else { "free" }];
        if expiring {
            classes.push("expiring");
        }
        if !row_warnings.is_empty() {
            classes.push("regression");
        }
        let name = lock.key.to_string();
        let _ = write!(
            out,
            "<tr class=\"{}\" data-resource=\"{}\"><td class=\"resource\">{}</td>",
            classes.join(" "),
            escape(&name),
            escape(&name)
        );
        match &lock.holder {
            Some(h) => {
                let _ = write!(out, "<td class=\"lock\">held by grant <code>{}</code></td>", h.grant);
                let _ = write!(out, "<td>{}</td>", h.fence.map_or_else(|| "not known".to_string(), |f| f.to_string()));
                let left = h.expires_in.map_or_else(
                    || "lasts with its session".to_string(),
                    |d| format!("{:.1} s{}", d.as_secs_f64(), if expiring { " (near expiry)" } else { "" }),
                );
                let _ = write!(out, "<td class=\"left\">{left}</td>");
            }
            None => out.push_str("<td class=\"lock\">free</td><td></td><td></td>"),
        }
        let counter = match lock.fence_counter {
            None => "not known".to_string(),
            Some(f) if f.get() == 0 => "0 (none kept)".to_string(),
            Some(f) => f.to_string(),
        };
        let _ = write!(out, "<td>{counter}</td><td>{}</td><td>", escape(&waiters_text(lock.waiters)));
        for (store, mark) in &row.marks {
            match mark {
                Some(m) => {
                    let by = match (m.grant, &lock.holder) {
                        (Some(g), Some(h)) if g == h.grant => format!("the holder (<code>{g}</code>)"),
                        (Some(g), _) => format!("<code>{g}</code>"),
                        (None, _) => "a grant not recorded".to_string(),
                    };
                    let _ = write!(out, "<div>{}: {} by {by}</div>", escape(store), Fence::get(m.fence));
                }
                None => {
                    let _ = write!(out, "<div>{}: none</div>", escape(store));
                }
            }
        }
        out.push_str("</td></tr>");
        for warning in row_warnings {
            let _ = write!(out, "<tr class=\"warning\"><td colspan=\"7\">WARNING: {}</td></tr>", escape(&warning));
        }
    }
    out.push_str("</tbody></table>");
    if !view.primitives.is_empty() {
        out.push_str("<h2>primitives</h2><ul class=\"primitives\">");
        for primitive in &view.primitives {
            let mut lines = primitive.to_lines().into_iter();
            let _ = write!(out, "<li>{}", escape(&lines.next().unwrap_or_default()));
            let rest: Vec<String> = lines.map(|l| format!("<li>{}</li>", escape(l.trim()))).collect();
            if !rest.is_empty() {
                let _ = write!(out, "<ul>{}</ul>", rest.concat());
            }
            out.push_str("</li>");
        }
        out.push_str("</ul>");
    }
    if view.truncated {
        let _ = write!(
            out,
            "<p class=\"truncated\">more than {} resources: narrow --prefix to see the rest</p>",
            palisade::MAX_LISTED
        );
    }
    out
}

/// `at` as `HH:MM:SS` on the UTC clock.
fn utc(at: SystemTime) -> String {
    let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Text made safe inside HTML elements and quoted attributes: resource names and URLs come
/// from whoever named the resource.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use palisade::{GrantId, HolderView, LockView, ResourceKey, WatermarkView};

    use super::super::Row;
    use super::*;

    fn snapshot(rows: Vec<Row>) -> Snapshot {
        Snapshot {
            lock: ("sqlite", "sqlite:///tmp/a.db".to_string()),
            stores: vec![("sqlite", "sqlite:///tmp/a.db".to_string())],
            rows,
            primitives: Vec::new(),
            truncated: false,
        }
    }

    fn row(name: &str, holder: Option<(u64, Duration)>, counter: u64, mark: Option<u64>) -> Row {
        let key = palisade::spi::parse_any_resource_key(name).unwrap_or_else(|e| panic!("{e}"));
        let mut lock = LockView::free(key).with_counter(Some(Fence::new(counter)));
        if let Some((fence, left)) = holder {
            lock = lock.held_by(HolderView::new(GrantId::from_bytes([7; 16]), Some(Fence::new(fence)), Some(left)));
        }
        Row {
            lock,
            marks: vec![(
                "sqlite",
                mark.map(|f| WatermarkView::new(Fence::new(f), Some(GrantId::from_bytes([1; 16])))),
            )],
        }
    }

    fn reading(rows: Vec<Row>) -> Reading {
        let at = SystemTime::now();
        Reading { at, view: Some((at, snapshot(rows))), error: None }
    }

    #[test]
    fn a_regression_and_a_lock_near_its_expiry_are_marked() {
        let page = render_page(
            &reading(vec![
                row("alloc:WH-01", Some((5, Duration::from_secs(30))), 5, Some(4)),
                row("alloc:WH-02", Some((9, Duration::from_millis(800))), 9, None),
                row("alloc:WH-03", None, 3, Some(6)),
            ]),
            Duration::from_secs(1),
        );
        assert!(page.contains("<tr class=\"held\" data-resource=\"alloc:WH-01\">"), "{page}");
        assert!(page.contains("<tr class=\"held expiring\" data-resource=\"alloc:WH-02\">"), "{page}");
        assert!(page.contains("<tr class=\"free regression\" data-resource=\"alloc:WH-03\">"), "{page}");
        assert!(page.contains("FENCE REGRESSION waiting"), "{page}");
        assert!(page.contains("1 warning<"), "{page}");
    }

    #[test]
    fn names_cannot_inject_markup() {
        let key = ResourceKey::new("alloc", "<script>x</script>").map(|k| k.to_string());
        let Ok(name) = key else { return }; // a key this version refuses cannot reach the page
        let page = render_page(&reading(vec![row(&name, None, 1, None)]), Duration::from_secs(2));
        assert!(!page.contains("<script>x"), "{page}");
        assert!(page.contains("&lt;script&gt;x"), "{page}");
    }

    #[test]
    fn a_failed_read_keeps_the_last_view_beside_its_error() {
        let mut last = reading(vec![row("alloc:WH-01", None, 1, None)]);
        last.error = Some("connection refused".to_string());
        let view = render_view(&last, Duration::from_secs(2));
        assert!(view.contains("role=\"alert\">Could not read at"), "{view}");
        assert!(view.contains("(the view below is older)"), "{view}");
        assert!(view.contains("data-resource=\"alloc:WH-01\""), "{view}");
    }

    #[test]
    fn utc_prints_the_time_of_day() {
        assert_eq!(utc(UNIX_EPOCH + Duration::from_secs(86_400 * 3 + 3_723)), "01:02:03");
    }
}
