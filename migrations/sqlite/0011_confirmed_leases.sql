-- An attempt is spent only by a run that started: a host confirms each run
-- it starts by writing its lease token here, and a lease that expires
-- unconfirmed gives its attempt back, at most three times a job (see
-- migrations/postgres/0017_confirmed_leases.sql).
ALTER TABLE jobs ADD COLUMN confirmed_token INTEGER;
ALTER TABLE jobs ADD COLUMN unconfirmed_expiries INTEGER NOT NULL DEFAULT 0;
