//! Sleeps that end within a fraction of a millisecond of their deadline.
//!
//! tokio's timers fire on a 1 ms wheel and round up, so a 5 ms sleep takes
//! about 6: too coarse for a guest's short sleeps (a fifth of a 5 ms job)
//! and for the embedded backend's close looks for another process's commit.
//! On Linux a sleep here arms a `timerfd` of its own, which the kernel fires
//! within its timer slack (50 µs by default) and tokio's reactor wakes on
//! like any other descriptor: a few system calls per sleep. Elsewhere, or
//! when a timerfd cannot be made, the tokio timer serves.

use std::time::{Duration, Instant};

/// Resolves at `deadline`, within the kernel's timer slack where it can.
pub async fn sleep_until(deadline: Instant) {
    #[cfg(target_os = "linux")]
    if timerfd::sleep_until(deadline).await.is_ok() {
        return;
    }
    tokio::time::sleep_until(deadline.into()).await;
}

#[cfg(target_os = "linux")]
mod timerfd {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Instant;

    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    /// Arms a one-shot timerfd for the time left and waits until the
    /// reactor reports it readable (expired).
    pub async fn sleep_until(deadline: Instant) -> io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        // SAFETY: timerfd_create takes no pointers; a non-negative result is
        // a descriptor this process now owns.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: left.as_secs().try_into().unwrap_or(libc::time_t::MAX),
                tv_nsec: left.subsec_nanos().into(),
            },
        };
        // SAFETY: `spec` is a valid itimerspec that outlives the call; the
        // old value is not asked for.
        if unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the `OwnedFd` moves into the `AsyncFd`, which alone owns
        // it, keeps it open until dropped, and always reports that one fd.
        let timer = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)?;
        loop {
            let mut ready = timer.readable().await?;
            let mut expirations = [0u8; 8];
            // SAFETY: the buffer is 8 writable bytes, what a timerfd read needs.
            let read = unsafe { libc::read(timer.as_raw_fd(), expirations.as_mut_ptr().cast(), expirations.len()) };
            if read == 8 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::WouldBlock {
                return Err(error);
            }
            ready.clear_ready();
        }
    }
}

/// Resolves after `duration`, as [`sleep_until`] does.
pub async fn sleep(duration: Duration) {
    match Instant::now().checked_add(duration) {
        Some(deadline) => sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Never early: a guest that sleeps 5 ms may count on 5 ms having
    /// passed. (How close to the deadline it wakes is a benchmark's
    /// question: `cargo bench --bench sandbox -- sleep`.)
    #[tokio::test]
    async fn a_sleep_never_ends_before_its_deadline() {
        for micros in [1, 300, 1_000, 5_300] {
            let deadline = Instant::now() + Duration::from_micros(micros);
            sleep_until(deadline).await;
            assert!(Instant::now() >= deadline, "woke before a {micros} µs deadline");
        }
    }

    #[tokio::test]
    async fn a_past_deadline_is_ready_at_once() {
        sleep_until(Instant::now() - Duration::from_millis(1)).await;
    }
}
