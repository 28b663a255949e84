//! Sealed secrets in SQLite: names, the sealing key's fingerprint,
//! nonces and ciphertexts; never a value.

use async_trait::async_trait;
use sqlx::{SqliteConnection, SqlitePool};

use super::SqliteStore;
use super::encode::now_ms;
use crate::store::Result;
use crate::store::audit::Change;
use crate::store::driver::SecretDriver;
use crate::store::secret::{Sealed, SecretInfo};

pub async fn set(conn: &mut SqliteConnection, name: &str, sealed: &Sealed, now: i64) -> Result<bool> {
    let existed: Option<i64> = sqlx::query_scalar("SELECT 1 FROM outbound_secrets WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO outbound_secrets (name, key_id, nonce, ciphertext, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $5)
         ON CONFLICT (name) DO UPDATE
            SET key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext,
                updated_at = excluded.updated_at",
    )
    .bind(name)
    .bind(&sealed.key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(existed.is_some())
}

pub async fn delete(conn: &mut SqliteConnection, name: &str) -> Result<bool> {
    let removed = sqlx::query("DELETE FROM outbound_secrets WHERE name = $1").bind(name).execute(conn).await?;
    Ok(removed.rows_affected() > 0)
}

pub async fn list(pool: &SqlitePool) -> Result<Vec<SecretInfo>> {
    let rows: Vec<(String, String, i64, i64)> =
        sqlx::query_as("SELECT name, key_id, created_at, updated_at FROM outbound_secrets ORDER BY name")
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(name, key_id, created, updated)| SecretInfo {
            name,
            key_id,
            created_at: super::time_of(created),
            updated_at: super::time_of(updated),
        })
        .collect())
}

pub async fn sealed(pool: &SqlitePool, names: &[String]) -> Result<Vec<(String, Sealed)>> {
    let mut found = Vec::new();
    for name in names {
        let row: Option<(String, Vec<u8>, Vec<u8>)> =
            sqlx::query_as("SELECT key_id, nonce, ciphertext FROM outbound_secrets WHERE name = $1")
                .bind(name)
                .fetch_optional(pool)
                .await?;
        if let Some((key_id, nonce, ciphertext)) = row {
            found.push((name.clone(), Sealed { key_id, nonce, ciphertext }));
        }
    }
    Ok(found)
}

#[async_trait]
impl SecretDriver for SqliteStore {
    async fn secret_set(&self, change: &Change<'_>, name: &str, sealed: &crate::store::secret::Sealed) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| set(tx, name, sealed, now_ms()).await).await
    }

    async fn secret_delete(&self, change: &Change<'_>, name: &str) -> Result<bool> {
        self.audited_outside_jobs(change, async |tx| delete(tx, name).await).await
    }

    async fn secrets_list(&self) -> Result<Vec<crate::store::secret::SecretInfo>> {
        list(&self.reader).await
    }

    async fn secrets_sealed(&self, names: &[String]) -> Result<Vec<(String, crate::store::secret::Sealed)>> {
        sealed(&self.reader, names).await
    }
}
