//! Which threads the kernel runs first when every core of the host is busy.
//!
//! A worker's throughput is the time its compute threads get on a core. Its other threads (the
//! gRPC service, object-store I/O, the reader and the assembler), and a dispatcher on the same
//! host, wake up thousands of times a second for a few microseconds each, to answer a request or
//! move a buffer. Under Linux's default policy such a wakeup may preempt a compute thread in the
//! middle of a decode. With many clients (many trainers, or a flood of bogus ones) that cost the
//! one compute thread of a 2-core worker a quarter of its core, while a fifth of the machine
//! stayed idle.
//!
//! So a serving process runs its threads under `SCHED_BATCH` ([`serve_without_preempting`]): the
//! same fair share of CPU time (the nice value is kept), but no preemption on wakeup. A woken
//! service thread takes an idle core at once, and otherwise waits for the next scheduler tick
//! (4 ms at most at 250 Hz). Compute threads put themselves back under the normal policy
//! ([`compute_first`]). Both are no-ops off Linux.

/// Runs the calling thread under `SCHED_BATCH`, and with it every thread and process it starts
/// from then on (they inherit the policy), until [`compute_first`] is called on one of them.
pub fn serve_without_preempting() -> std::io::Result<()> {
    set_policy(Policy::Batch)
}

/// Runs the calling thread under the normal policy (`SCHED_OTHER`), whatever it inherited: its
/// wakeups may preempt the threads under `SCHED_BATCH`.
pub fn compute_first() -> std::io::Result<()> {
    set_policy(Policy::Normal)
}

enum Policy {
    Normal,
    Batch,
}

#[cfg(target_os = "linux")]
fn set_policy(policy: Policy) -> std::io::Result<()> {
    let policy = match policy {
        Policy::Normal => libc::SCHED_OTHER,
        Policy::Batch => libc::SCHED_BATCH,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` outlives the call, which only reads it. On Linux the policy is per thread,
    // and pid 0 names the calling thread.
    let set = unsafe { libc::sched_setscheduler(0, policy, &raw const param) };
    if set == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(not(target_os = "linux"))]
fn set_policy(_: Policy) -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn policy_of_this_thread() -> i32 {
        // SAFETY: no memory is passed; pid 0 names the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_batch_thread_starts_batch_threads_and_a_compute_thread_goes_back_to_normal() {
        let seen = std::thread::spawn(|| {
            serve_without_preempting().expect("any thread may move itself to SCHED_BATCH");
            let inherited = std::thread::spawn(policy_of_this_thread).join().expect("a thread");
            let computing = std::thread::spawn(|| {
                compute_first().expect("any thread may go back to SCHED_OTHER");
                policy_of_this_thread()
            })
            .join()
            .expect("a thread");
            (policy_of_this_thread(), inherited, computing)
        })
        .join()
        .expect("a thread");
        assert_eq!(seen, (libc::SCHED_BATCH, libc::SCHED_BATCH, libc::SCHED_OTHER));
        assert_eq!(policy_of_this_thread(), libc::SCHED_OTHER, "other threads keep their own");
    }
}
