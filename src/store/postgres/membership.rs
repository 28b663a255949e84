//! Batch membership as jobs are written: counting new members into their
//! batches. Below both the job writer, which calls it for every insert, and
//! the batch writer, which inserts a batch's first members.

use sqlx::PgConnection;

use crate::store::{Error, PreparedJob, Result};

/// Counts the batch members among `jobs`, inserted and past the gate, into
/// their batches, refusing a batch that is missing or closed. Locks: those
/// batches' rows, in id order, until the caller commits.
pub async fn add_members(conn: &mut PgConnection, jobs: &[&PreparedJob]) -> Result<()> {
    if jobs.iter().all(|j| j.batch_id.is_none()) {
        return Ok(());
    }
    let ids: Vec<Option<i64>> = jobs.iter().map(|j| j.batch_id).collect();
    let closed_ok: Vec<bool> = jobs.iter().map(|j| j.batch_by_member).collect();
    sqlx::query("SELECT jobhost.batch_add_members($1, $2)")
        .bind(&ids)
        .bind(&closed_ok)
        .execute(conn)
        .await
        .map_err(refused_or_failed)?;
    Ok(())
}

/// The batch functions' refusal of a missing or closed batch (SQLSTATE
/// 22023) as [`Error::BatchRefused`], as SQLite names it too; any other
/// error as it is.
pub(super) fn refused_or_failed(error: sqlx::Error) -> Error {
    match error {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("22023") => {
            Error::BatchRefused(db.message().to_string())
        }
        error => error.into(),
    }
}
