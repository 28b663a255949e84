//! Job types' plain variables in SQLite.

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::VariableDriver;
use crate::store::variable::TypeVariable;

pub async fn set(conn: &mut SqliteConnection, job_type: &str, name: &str, value: &str, now: i64) -> Result<bool> {
    let existed: Option<i64> = sqlx::query_scalar("SELECT 1 FROM type_variables WHERE job_type = $1 AND name = $2")
        .bind(job_type)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO type_variables (job_type, name, value, updated_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (job_type, name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
    )
    .bind(job_type)
    .bind(name)
    .bind(value)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(existed.is_some())
}

pub async fn unset(conn: &mut SqliteConnection, job_type: &str, name: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM type_variables WHERE job_type = $1 AND name = $2")
        .bind(job_type)
        .bind(name)
        .execute(conn)
        .await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &SqlitePool, job_type: Option<&str>) -> Result<Vec<TypeVariable>> {
    let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
        "SELECT job_type, name, value, updated_at FROM type_variables
         WHERE $1 IS NULL OR job_type = $1 ORDER BY job_type, name",
    )
    .bind(job_type)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(job_type, name, value, updated_at)| TypeVariable {
            job_type,
            name,
            value,
            updated_at: super::time_of(updated_at),
        })
        .collect())
}

#[async_trait]
impl VariableDriver for SqliteStore {
    async fn var_set(&self, change: &Change<'_>, job_type: &str, name: &str, value: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| set(tx, job_type, name, value, now_ms()).await).await
    }

    async fn var_unset(&self, change: &Change<'_>, job_type: &str, name: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| unset(tx, job_type, name).await).await
    }

    async fn vars(&self, job_type: Option<&str>) -> Result<Vec<crate::store::variable::TypeVariable>> {
        list(&self.reader, job_type).await
    }
}
