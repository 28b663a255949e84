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

/// Each type's variables, as last read.
pub struct Variables {
    source: VariableSource,
    /// Behind one async lock: when a type's copy goes stale, one run reads
    /// it again while the others of that moment wait for the answer.
    kept: Mutex<HashMap<String, (Instant, Read)>>,
}

impl Variables {
    /// Variables read from `source`.
    pub fn new(source: VariableSource) -> Self {
        Variables { source, kept: Mutex::default() }
    }

    /// `job_type`'s variables, read at most [`FRESH_FOR`] ago.
    ///
    /// # Errors
    /// They cannot be read and none were read before: the run should not
    /// start without them.
    pub async fn of(&self, job_type: &str) -> Result<Read, String> {
        let mut kept = self.kept.lock().await;
        if let Some((at, variables)) = kept.get(job_type)
            && at.elapsed() < FRESH_FOR
        {
            return Ok(variables.clone());
        }
        match (self.source)(job_type.to_string()).await {
            Ok(variables) => {
                let variables = Arc::new(variables);
                kept.insert(job_type.to_string(), (Instant::now(), variables.clone()));
                Ok(variables)
            }
            // The last values read are better than none: a change waits
            // for the database to answer again.
            Err(error) => match kept.get(job_type) {
                Some((_, variables)) => {
                    tracing::warn!(job_type, %error, "cannot read variables again; runs keep the last read");
                    Ok(variables.clone())
                }
                None => Err(format!("cannot read job type {job_type}'s variables: {error}")),
            },
        }
    }
}

/// Variables read from the fleet's database.
pub fn variables_from(store: Arc<dyn crate::store::Store>) -> VariableSource {
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
}
