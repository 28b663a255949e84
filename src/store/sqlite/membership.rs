//! Batch membership as jobs are written: counting new members into their
//! batches. Below both the job writer, which calls it for every insert, and
//! the batch writer, which inserts a batch's first members.

use std::collections::BTreeMap;

use sqlx::SqliteConnection;

use crate::store::{Error, PreparedJob, Result};

/// Counts the batch members among `jobs` into their batches before they are
/// inserted, refusing a batch that is missing or closed.
pub async fn add_members(conn: &mut SqliteConnection, jobs: &[&PreparedJob]) -> Result<()> {
    // Per batch: how many members, and whether all come from its running members.
    let mut counts: BTreeMap<i64, (i64, bool)> = BTreeMap::new();
    for job in jobs {
        if let Some(batch) = job.batch_id {
            let count = counts.entry(batch).or_insert((0, true));
            count.0 += 1;
            count.1 &= job.batch_by_member;
        }
    }
    for (batch, (n, by_member)) in counts {
        let closed: Option<Option<i64>> = sqlx::query_scalar("SELECT closed_at FROM batches WHERE id = $1")
            .bind(batch)
            .fetch_optional(&mut *conn)
            .await?;
        match closed {
            None => return Err(Error::BatchRefused(format!("batch {batch} does not exist"))),
            Some(Some(_)) if !by_member => {
                return Err(Error::BatchRefused(format!("batch {batch} is closed: it takes no more jobs")));
            }
            Some(_) => {}
        }
        sqlx::query("UPDATE batches SET total = total + $2 WHERE id = $1")
            .bind(batch)
            .bind(n)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}
