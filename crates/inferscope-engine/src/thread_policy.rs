//! `SCHED_BATCH` for the engine's threads whose wake-up must not preempt the
//! thread that woke them. `SCHED_BATCH` is exactly "do not preempt on
//! wake-up" for a normal thread: the same share of the CPU, the same nice
//! level, but a woken thread waits for the running one to yield or use up its
//! slice. Two threads use it:
//!
//! - **The idle engine thread**, only while it sleeps (its steps run under
//!   the normal policy). On a busy core, an engine woken by the first `Add`
//!   of a burst used to run at once (the kernel favours a thread that has
//!   slept), step that one request alone, and sleep again, a pair of context
//!   switches per request; woken without preemption it starts when the waker
//!   yields the core, with the whole burst in its queue
//!   (`docs/results/request-path.md`). With an idle core free, the wake-up
//!   goes there at once, as before.
//! - **The grammar threads**, always. The engine thread wakes them with a
//!   step's matchers and then still has to start the step; woken with
//!   preemption they took its core on a small machine, and the device waited
//!   (`docs/results/structured-outputs.md`). Their masks are needed only at
//!   the end of the step.
//!
//! A thread that an operator put under another policy (e.g. with `chrt`) is
//! left alone: callers check [`is_normal`] first.

/// Whether the calling thread runs under the normal policy (`SCHED_OTHER`).
#[cfg(target_os = "linux")]
pub(crate) fn is_normal() -> bool {
    // SAFETY: no arguments but the calling thread's id (0).
    let policy = unsafe { libc::sched_getscheduler(0) };
    policy == libc::SCHED_OTHER
}

/// Puts the calling thread under `SCHED_BATCH` (`batch`) or back under
/// `SCHED_OTHER`; a refusal (a sandbox) leaves the policy as it was.
#[cfg(target_os = "linux")]
pub(crate) fn set_batch(batch: bool) {
    let policy = if batch {
        libc::SCHED_BATCH
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid `sched_param` that outlives the call, and 0
    // names the calling thread.
    let _ = unsafe { libc::sched_setscheduler(0, policy, &param) };
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn is_normal() -> bool {
    false
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn set_batch(_batch: bool) {}

/// Puts the calling thread under `SCHED_BATCH` for good, unless an operator
/// chose its policy (a thread that only works when woken: the grammar
/// threads).
pub(crate) fn run_as_batch() {
    if is_normal() {
        set_batch(true);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn a_thread_goes_to_batch_and_back() {
        std::thread::spawn(|| {
            assert!(super::is_normal(), "a new thread runs under SCHED_OTHER");
            // SAFETY: the calling thread's own policy (pid 0).
            let policy = || unsafe { libc::sched_getscheduler(0) };
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as in `set_batch`: a valid `sched_param`, the calling thread.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) } != 0 {
                // A sandbox that refuses the call: the threads then wake as
                // before, and there is nothing to check.
                eprintln!("sched_setscheduler is refused here: the policy is not checked");
                return;
            }
            super::set_batch(true);
            assert_eq!(policy(), libc::SCHED_BATCH);
            assert!(
                !super::is_normal(),
                "a policy other than the normal one is left alone"
            );
            super::set_batch(false);
            assert_eq!(policy(), libc::SCHED_OTHER);
            super::run_as_batch();
            assert_eq!(policy(), libc::SCHED_BATCH);
        })
        .join()
        .unwrap();
    }
}
