//! The loops a host runs beside its workers, each on its own timer or
//! notification, each restartable by the supervisor: the sweeps
//! ([`maintenance`]), the schedules ([`scheduler`]), components deployed
//! through the database ([`deployments`]) and the job types recorded as
//! components load ([`registration`]).

pub mod deployments;
pub mod maintenance;
pub mod registration;
pub mod scheduler;
