//! Job types' plain variables in PostgreSQL.

use async_trait::async_trait;
use sqlx::{PgConnection, PgPool};

use super::PgStore;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::VariableDriver;
use crate::store::variable::TypeVariable;

pub async fn set(conn: &mut PgConnection, job_type: &str, name: &str, value: &str) -> Result<bool> {
    // `xmax <> 0` on the returned row: the insert met the old row and updated it.
    let replaced: bool = sqlx::query_scalar(
        "INSERT INTO jobhost.type_variables (job_type, name, value) VALUES ($1, $2, $3)
         ON CONFLICT (job_type, name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
         RETURNING xmax <> 0",
    )
    .bind(job_type)
    .bind(name)
    .bind(value)
    .fetch_one(conn)
    .await?;
    Ok(replaced)
}

pub async fn unset(conn: &mut PgConnection, job_type: &str, name: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM jobhost.type_variables WHERE job_type = $1 AND name = $2")
        .bind(job_type)
        .bind(name)
        .execute(conn)
        .await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &PgPool, job_type: Option<&str>) -> Result<Vec<TypeVariable>> {
    let rows: Vec<(String, String, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT job_type, name, value, updated_at FROM jobhost.type_variables
         WHERE $1::text IS NULL OR job_type = $1 ORDER BY job_type, name",
    )
    .bind(job_type)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(job_type, name, value, updated_at)| TypeVariable { job_type, name, value, updated_at })
        .collect())
}

#[async_trait]
impl VariableDriver for PgStore {
    async fn var_set(&self, change: &Change<'_>, job_type: &str, name: &str, value: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| set(conn, job_type, name, value).await).await
    }

    async fn var_unset(&self, change: &Change<'_>, job_type: &str, name: &str) -> Result<bool> {
        super::audit::audited(&self.pool, change, async |conn| unset(conn, job_type, name).await).await
    }

    async fn vars(&self, job_type: Option<&str>) -> Result<Vec<crate::store::variable::TypeVariable>> {
        list(&self.pool, job_type).await
    }
}
