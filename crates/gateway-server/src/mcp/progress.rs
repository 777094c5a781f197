//! Progress while a call runs: each stage of the pipeline as it happens,
//! and between stages a heartbeat, so that a client whose request timer is
//! reset by progress (the TypeScript SDK's default gives up after 60 s
//! without it) keeps waiting for a long plan or apply.
//!
//! `progress` is the seconds since the call began (strictly increasing, as
//! the protocol asks); `total`, while a stage has a deadline (a sandbox's
//! wall-clock limit), is the second by which that stage will have ended.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedReceiver;

use gateway_core::pipeline::Stage;

/// The longest the gateway lets a client go without progress.
pub const MAX_HEARTBEAT: Duration = Duration::from_secs(10);
/// How often a heartbeat goes out when the operator does not say.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);

/// One progress report.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub progress: f64,
    pub total: Option<f64>,
    pub message: String,
}

/// Turn the call's stages into notes until the pipeline drops its end of
/// the channel, with a heartbeat every `every` (at most
/// [`MAX_HEARTBEAT`]) after the last note.
pub async fn forward<F, Fut>(mut stages: UnboundedReceiver<Stage>, every: Duration, mut send: F)
where
    F: FnMut(Note) -> Fut,
    Fut: Future<Output = ()>,
{
    let every = every.clamp(Duration::from_millis(10), MAX_HEARTBEAT);
    let start = Instant::now();
    let mut last = 0.0_f64;
    // The current stage: its message, when it began, its deadline.
    let mut current: Option<(String, Duration, Option<Duration>)> = None;
    let mut next_beat = tokio::time::Instant::now() + every;
    loop {
        let message = tokio::select! {
            stage = stages.recv() => match stage {
                None => break,
                Some(stage) => {
                    current = Some((stage.message.clone(), start.elapsed(), stage.within));
                    stage.message
                }
            },
            _ = tokio::time::sleep_until(next_beat) => {
                let what = current.as_ref().map(|c| c.0.as_str()).unwrap_or("the call is being decided");
                format!("still working ({} s so far): {what}", start.elapsed().as_secs())
            }
        };
        next_beat = tokio::time::Instant::now() + every;
        let elapsed = start.elapsed().as_secs_f64();
        // Strictly increasing, in milliseconds.
        let progress = ((elapsed.max(last + 0.001)) * 1000.0).round() / 1000.0;
        last = progress;
        let total = current
            .as_ref()
            .and_then(|(_, began, within)| {
                within.map(|w| ((*began + w).as_secs_f64() * 1000.0).round() / 1000.0)
            })
            .filter(|t| *t > progress);
        send(Note {
            progress,
            total,
            message,
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[tokio::test]
    async fn stages_and_heartbeats_increase_and_a_deadline_is_the_total() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let notes = Arc::new(Mutex::new(Vec::new()));
        let got = Arc::clone(&notes);
        let fwd = tokio::spawn(forward(rx, Duration::from_millis(40), move |n| {
            got.lock().map(|mut v| v.push(n)).ok();
            async {}
        }));
        tx.send(Stage {
            message: "policy allowed".into(),
            within: None,
        })
        .ok();
        tx.send(Stage {
            message: "sandbox s started".into(),
            within: Some(Duration::from_secs(600)),
        })
        .ok();
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(tx);
        fwd.await.ok();
        let notes = notes.lock().map(|v| v.clone()).unwrap_or_default();
        assert!(
            notes.len() >= 4,
            "two stages and at least two heartbeats: {notes:?}"
        );
        assert_eq!(notes[0].message, "policy allowed");
        assert_eq!(notes[0].total, None);
        let total = notes[1].total.unwrap_or_default();
        assert!((600.0..601.0).contains(&total), "{notes:?}");
        for w in notes.windows(2) {
            assert!(w[1].progress > w[0].progress, "{notes:?}");
        }
        let beats: Vec<_> = notes[2..].iter().collect();
        assert!(
            beats.iter().all(|n| n.message.starts_with("still working")
                && n.message.ends_with("sandbox s started")),
            "{beats:?}"
        );
        assert!(beats.iter().all(|n| n.total == Some(total)), "{beats:?}");
    }

    #[tokio::test]
    async fn a_heartbeat_goes_out_before_any_stage() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Stage>();
        let notes = Arc::new(Mutex::new(Vec::new()));
        let got = Arc::clone(&notes);
        let fwd = tokio::spawn(forward(rx, Duration::from_millis(30), move |n| {
            got.lock().map(|mut v| v.push(n)).ok();
            async {}
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(tx);
        fwd.await.ok();
        let notes = notes.lock().map(|v| v.clone()).unwrap_or_default();
        assert!(!notes.is_empty());
        assert!(notes[0].message.contains("being decided"), "{notes:?}");
    }
}
