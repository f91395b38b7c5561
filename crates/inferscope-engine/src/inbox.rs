//! The queue into a thread that sleeps when it has nothing to do (an engine
//! core, its output thread): many senders, one receiving thread, and a
//! sender wakes that thread only **after** it has let go of the queue's lock.
//!
//! `std::sync::mpsc` wakes a sleeping receiver while still holding the lock
//! of its waiter list. On a busy core the woken thread runs at once, finds
//! that lock taken, and sleeps on it until the sender runs again to release
//! it: two more context switches per wake-up, on the path of every request
//! that arrives at an idle engine (`docs/results/request-path.md`). Here the
//! receiver only ever waits on its own thread's park token, never on a lock
//! that a sender holds across a wake-up.
//!
//! The error types are `std::sync::mpsc`'s, so the call sites read the same.

use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::mpsc::{RecvError, RecvTimeoutError, SendError, TryRecvError};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A new queue: its senders (clone them for more) and its one receiver.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::new(),
        sleeper: None,
        senders: 1,
        receiver_alive: true,
    }));
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver {
            shared,
            _one_thread: PhantomData,
        },
    )
}

struct State<T> {
    queue: VecDeque<T>,
    /// The receiving thread, while it sleeps (or is about to): whoever takes
    /// it out wakes it.
    sleeper: Option<Thread>,
    senders: usize,
    receiver_alive: bool,
}

/// Puts messages on the queue; cloneable.
pub struct Sender<T> {
    shared: Arc<Mutex<State<T>>>,
}

/// Takes messages off the queue, on one thread.
pub struct Receiver<T> {
    shared: Arc<Mutex<State<T>>>,
    /// One thread receives (the queue keeps one sleeper): not `Sync`.
    _one_thread: PhantomData<Cell<()>>,
}

impl<T> Sender<T> {
    /// Queues `msg` and wakes the receiver if it sleeps; the message comes
    /// back when the receiver is gone.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        let sleeper = {
            let mut state = self.shared.lock();
            if !state.receiver_alive {
                return Err(SendError(msg));
            }
            state.queue.push_back(msg);
            state.sleeper.take()
        };
        // Outside the lock: the woken thread may run before this one returns.
        if let Some(t) = sleeper {
            t.unpark();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let sleeper = {
            let mut state = self.shared.lock();
            state.senders -= 1;
            if state.senders > 0 {
                return;
            }
            // The last sender: a sleeping receiver must learn it is alone.
            state.sleeper.take()
        };
        if let Some(t) = sleeper {
            t.unpark();
        }
    }
}

impl<T> Receiver<T> {
    /// The next message, without waiting.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.shared.lock().pop()
    }

    /// The next message, sleeping until one comes; an error once the queue
    /// is empty and every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        loop {
            match self.take_or_sleep() {
                Ok(m) => return Ok(m),
                Err(TryRecvError::Disconnected) => return Err(RecvError),
                Err(TryRecvError::Empty) => thread::park(),
            }
        }
    }

    /// As [`Receiver::recv`], giving up after `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.take_or_sleep() {
                Ok(m) => return Ok(m),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        self.shared.lock().sleeper = None;
                        return Err(RecvTimeoutError::Timeout);
                    }
                    thread::park_timeout(left);
                }
            }
        }
    }

    /// Pops a message, or registers this thread as the sleeper when there is
    /// none (under the lock, so no send can slip between the two).
    fn take_or_sleep(&self) -> Result<T, TryRecvError> {
        let mut state = self.shared.lock();
        let popped = state.pop();
        if matches!(popped, Err(TryRecvError::Empty)) && state.sleeper.is_none() {
            state.sleeper = Some(thread::current());
        }
        popped
    }
}

impl<T> State<T> {
    /// The next message, or why there is none.
    fn pop(&mut self) -> Result<T, TryRecvError> {
        match self.queue.pop_front() {
            Some(m) => {
                // The receiver is awake: a send need not wake it.
                self.sleeper = None;
                Ok(m)
            }
            None if self.senders == 0 => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let dropped = {
            let mut state = self.shared.lock();
            state.receiver_alive = false;
            std::mem::take(&mut state.queue)
        };
        // Messages own resources (a request's output sink): freed outside
        // the lock.
        drop(dropped);
    }
}

/// Receives until the queue is empty and every sender gone.
impl<T> Iterator for Receiver<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_in_order_and_the_end_is_seen() {
        let (tx, rx) = channel();
        let tx2 = tx.clone();
        let producer = thread::spawn(move || {
            for i in 0..10_000u32 {
                tx.send(i).unwrap();
            }
        });
        producer.join().unwrap();
        tx2.send(10_000).unwrap();
        drop(tx2);
        let got: Vec<u32> = rx.collect();
        assert_eq!(got, (0..=10_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_sleeping_receiver_is_woken_by_every_send() {
        // The receiver sleeps between sends (the producer waits for each
        // reply), so a lost wake-up times out instead of passing.
        let (tx, rx) = channel::<u32>();
        let (back_tx, back_rx) = channel::<u32>();
        let echo = thread::spawn(move || {
            for m in rx {
                back_tx.send(m * 2).unwrap();
            }
        });
        for i in 0..2_000 {
            tx.send(i).unwrap();
            assert_eq!(back_rx.recv_timeout(Duration::from_secs(10)), Ok(i * 2));
        }
        drop(tx);
        echo.join().unwrap();
        assert_eq!(
            back_rx.recv(),
            Err(RecvError),
            "the echo thread's sender is gone"
        );
    }

    #[test]
    fn many_senders_lose_nothing() {
        let (tx, rx) = channel::<(usize, u32)>();
        let senders: Vec<_> = (0..4)
            .map(|s| {
                let tx = tx.clone();
                thread::spawn(move || {
                    for i in 0..5_000 {
                        tx.send((s, i)).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let mut next = [0u32; 4];
        for (s, i) in rx {
            assert_eq!(i, next[s], "sender {s}'s messages out of order");
            next[s] += 1;
        }
        for s in senders {
            s.join().unwrap();
        }
        assert_eq!(next, [5_000; 4]);
    }

    #[test]
    fn timeouts_empty_queues_and_a_gone_receiver() {
        let (tx, rx) = channel::<u8>();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(5)),
            Err(RecvTimeoutError::Timeout)
        );
        tx.send(7).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(7));
        let late = {
            let tx = tx.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(20));
                tx.send(9).unwrap();
            })
        };
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(9));
        late.join().unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(1)),
            Err(RecvTimeoutError::Disconnected)
        );

        let (tx, rx) = channel::<Arc<()>>();
        let held = Arc::new(());
        tx.send(Arc::clone(&held)).unwrap();
        drop(rx);
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "queued messages are dropped with the receiver"
        );
        assert!(tx.send(held).is_err());
    }
}
