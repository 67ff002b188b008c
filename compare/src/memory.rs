//! Server memory during a run: the resident set of processes named on the command line
//! (`--watch-memory NAME=PID`), sampled once a second, so that a report can say whether a server
//! grows with the work (etcd's history without compaction, say).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

/// How often the resident set is read.
const EVERY: Duration = Duration::from_secs(1);

/// One watched process: what it is called in the report, its pid, and what was seen.
#[derive(Debug, Clone, Serialize)]
pub struct Watched {
    pub name: String,
    pub pid: u32,
    /// Resident set at the first sample, in KiB.
    pub start_kib: u64,
    /// The largest resident set sampled, in KiB, and when (seconds into the run).
    pub peak_kib: u64,
    pub peak_at_s: u64,
    /// Resident set at the last sample, in KiB.
    pub end_kib: u64,
    pub samples: u64,
    /// The process was gone before the run ended (its figures end there).
    pub gone: bool,
}

/// Samples the watched processes until [`Sampler::finish`].
pub struct Sampler {
    watched: Arc<Mutex<Vec<Watched>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    started: tokio::time::Instant,
}

/// Parses `NAME=PID`.
pub fn parse(spec: &str) -> Result<(String, u32), String> {
    let (name, pid) = spec.split_once('=').ok_or_else(|| format!("--watch-memory takes NAME=PID, not {spec:?}"))?;
    let pid = pid.trim().parse::<u32>().map_err(|_| format!("--watch-memory {spec:?}: {pid:?} is not a process id"))?;
    if name.trim().is_empty() {
        return Err(format!("--watch-memory {spec:?}: the name is empty"));
    }
    Ok((name.trim().to_string(), pid))
}

/// The resident set of `pid` in KiB (`VmRSS` in `/proc/PID/status`); `None` when it is gone.
fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Reads each watched process's resident set, `at` seconds into the run.
fn sample(watched: &mut [Watched], at: u64) {
    for w in watched.iter_mut().filter(|w| !w.gone) {
        match resident_kib(w.pid) {
            Some(rss) => {
                w.samples += 1;
                w.end_kib = rss;
                if rss > w.peak_kib {
                    (w.peak_kib, w.peak_at_s) = (rss, at);
                }
            }
            None => w.gone = true,
        }
    }
}

impl Sampler {
    /// Starts sampling `specs` (`NAME=PID` each); an unreadable process is an error at once.
    pub fn start(specs: &[String]) -> Result<Sampler, String> {
        let mut watched = Vec::new();
        for spec in specs {
            let (name, pid) = parse(spec)?;
            let rss = resident_kib(pid)
                .ok_or_else(|| format!("--watch-memory {spec}: no process {pid} whose memory can be read"))?;
            watched.push(Watched {
                name,
                pid,
                start_kib: rss,
                peak_kib: rss,
                peak_at_s: 0,
                end_kib: rss,
                samples: 1,
                gone: false,
            });
        }
        let watched = Arc::new(Mutex::new(watched));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let started = tokio::time::Instant::now();
        let task = (!specs.is_empty()).then(|| {
            let watched = Arc::clone(&watched);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = &mut stopped => return,
                        () = tokio::time::sleep(EVERY) => {}
                    }
                    sample(&mut watched.lock().unwrap_or_else(PoisonError::into_inner), started.elapsed().as_secs());
                }
            })
        });
        Ok(Sampler { watched, stop: Some(stop), task, started })
    }

    /// Stops sampling and returns what was seen.
    pub async fn finish(mut self) -> Vec<Watched> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // The end is now, not the last tick.
        sample(&mut watched, self.started.elapsed().as_secs());
        watched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_name_equals_pid() {
        assert_eq!(parse("etcd=42").unwrap(), ("etcd".to_string(), 42));
        for bad in ["etcd", "etcd=", "=42", "etcd=x", "etcd=-1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_own_process_is_sampled() {
        let me = format!("self={}", std::process::id());
        let sampler = Sampler::start(&[me]).unwrap();
        let seen = sampler.finish().await;
        assert_eq!(seen.len(), 1);
        assert!(seen[0].start_kib > 0 && seen[0].peak_kib >= seen[0].start_kib);
        assert!(Sampler::start(&["gone=4294967295".to_string()]).is_err());
    }
}
