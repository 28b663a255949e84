//! A job type's plain variables as its runs see them: read from the
//! fleet's database and kept for [`FRESH_FOR`], so a change reaches every
//! host's next runs within seconds without a query for each run.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// Reads one job type's variables, by name.
pub type VariableSource =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<Vec<(String, String)>, String>> + Send>> + Send + Sync>;

/// One type's variables, by name, as read.
type Read = Arc<Vec<(String, String)>>;

/// How long a type's variables read once serve its runs.
pub const FRESH_FOR: Duration = Duration::from_secs(2);

/// One type's last copy, and the lock one run holds while it reads again.
#[derive(Default)]
struct Slot {
    copy: std::sync::Mutex<Option<(Instant, Read)>>,
    reading: Mutex<()>,
}

impl Slot {
    fn copy(&self) -> Option<(Instant, Read)> {
        self.copy.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}

/// Each type's variables, as last read.
pub struct Variables {
    source: VariableSource,
    /// One slot per type: when a type's copy goes stale one of its runs
    /// reads it again while its other runs keep the stale copy, and other
    /// types' runs never wait on it.
    kept: std::sync::Mutex<HashMap<String, Arc<Slot>>>,
}

impl Variables {
    /// Variables read from `source`.
    pub fn new(source: VariableSource) -> Self {
        Variables { source, kept: Default::default() }
    }

    /// `job_type`'s variables, read at most [`FRESH_FOR`] ago, or the last
    /// copy while another run reads them again.
    ///
    /// # Errors
    /// They cannot be read and none were read before: the run should not
    /// start without them.
    pub async fn of(&self, job_type: &str) -> Result<Read, String> {
        let slot = {
            let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            kept.entry(job_type.to_string()).or_default().clone()
        };
        let fresh = |copy: &Option<(Instant, Read)>| copy.as_ref().filter(|(at, _)| at.elapsed() < FRESH_FOR).cloned();
        let last = slot.copy();
        if let Some((_, variables)) = fresh(&last) {
            return Ok(variables);
        }
        let _reading = match (slot.reading.try_lock(), &last) {
            (Ok(reading), _) => reading,
            // Another run is reading them again: the last copy serves.
            (Err(_), Some((_, variables))) => return Ok(variables.clone()),
            (Err(_), None) => slot.reading.lock().await,
        };
        let last = slot.copy();
        if let Some((_, variables)) = fresh(&last) {
            return Ok(variables);
        }
        match (self.source)(job_type.to_string()).await {
            Ok(variables) => {
                let variables = Arc::new(variables);
                *slot.copy.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                    Some((Instant::now(), variables.clone()));
                Ok(variables)
            }
            // The last values read are better than none: a change waits
            // for the database to answer again.
            Err(error) => match last {
                Some((_, variables)) => {
                    tracing::warn!(job_type, %error, "cannot read variables again; runs keep the last read");
                    Ok(variables)
                }
                None => Err(format!("cannot read job type {job_type}'s variables: {error}")),
            },
        }
    }
}

/// Variables read from the fleet's database.
pub fn variables_from(store: crate::store::Store) -> VariableSource {
    Arc::new(move |job_type| {
        let store = store.clone();
        Box::pin(async move {
            let variables = store.vars(Some(&job_type)).await.map_err(|e| e.to_string())?;
            Ok(variables.into_iter().map(|v| (v.name, v.value)).collect())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_type_is_read_once_while_fresh_and_kept_when_the_source_fails() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counter = reads.clone();
        let source: VariableSource = Arc::new(move |job_type| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match (job_type.as_str(), n) {
                    ("broken", _) => Err("the database is away".to_string()),
                    _ => Ok(vec![("REGION".to_string(), format!("eu-{n}"))]),
                }
            })
        });
        let variables = Variables::new(source);
        let first = variables.of("mail").await.unwrap();
        assert_eq!(*variables.of("mail").await.unwrap(), *first);
        assert_eq!(reads.load(Ordering::SeqCst), 1, "served from memory while fresh");
        let error = variables.of("broken").await.unwrap_err();
        assert!(error.contains("cannot read job type broken's variables: the database is away"), "{error}");
    }

    #[tokio::test]
    async fn a_type_whose_read_hangs_holds_up_no_other_type() {
        let source: VariableSource = Arc::new(move |job_type| {
            Box::pin(async move {
                if job_type == "slow" {
                    std::future::pending::<()>().await;
                }
                Ok(vec![("REGION".to_string(), "eu".to_string())])
            })
        });
        let variables = Arc::new(Variables::new(source));
        let slow = tokio::spawn({
            let variables = variables.clone();
            async move { variables.of("slow").await }
        });
        tokio::task::yield_now().await;
        let mail = tokio::time::timeout(Duration::from_secs(10), variables.of("mail")).await;
        assert_eq!(mail.expect("not held up").unwrap()[0].1, "eu");
        slow.abort();
    }
}
