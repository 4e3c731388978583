//! The sliding window: the last `window_size` calls, lock-free.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

// A window slot: empty, or a recorded call with its failed and slow bits.
pub(super) const RECORDED: u8 = 1;
pub(super) const FAILED: u8 = 2;
pub(super) const SLOW: u8 = 4;

/// The last `window_size` calls: a ring of atomic slots with running counts.
#[derive(Debug)]
pub(super) struct Window {
    slots: Box<[AtomicU8]>,
    next: AtomicU64,
    calls: AtomicU32,
    failures: AtomicU32,
    slow: AtomicU32,
}

impl Window {
    pub(super) fn new(size: u32) -> Self {
        Window {
            slots: (0..size).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicU64::new(0),
            calls: AtomicU32::new(0),
            failures: AtomicU32::new(0),
            slow: AtomicU32::new(0),
        }
    }

    pub(super) fn push(&self, outcome: u8) {
        // The slot count fits in u32, so the remainder fits in usize.
        let index = (self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len() as u64) as usize;
        // Count an outcome before it becomes visible in its slot, and un-count the one
        // it evicts after: whoever evicts a slot finds its counts already added, so the
        // counts never drop below zero (they may run one call ahead for a moment).
        self.adjust(outcome, true);
        let evicted = self.slots[index].swap(outcome, Ordering::AcqRel);
        self.adjust(evicted, false);
    }

    pub(super) fn clear(&self) {
        for slot in &self.slots {
            self.adjust(slot.swap(0, Ordering::AcqRel), false);
        }
    }

    fn adjust(&self, outcome: u8, add: bool) {
        for (bit, count) in [
            (RECORDED, &self.calls),
            (FAILED, &self.failures),
            (SLOW, &self.slow),
        ] {
            if outcome & bit != 0 {
                if add {
                    count.fetch_add(1, Ordering::Relaxed);
                } else {
                    count.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// (calls, failures, slow calls).
    pub(super) fn counts(&self) -> (u32, u32, u32) {
        (
            self.calls.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
            self.slow.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_overwrites_and_clear() {
        let window = Window::new(3);
        window.push(RECORDED | FAILED);
        window.push(RECORDED | SLOW);
        window.push(RECORDED | FAILED | SLOW);
        assert_eq!(window.counts(), (3, 2, 2));
        // Evicts the first failure.
        window.push(RECORDED);
        assert_eq!(window.counts(), (3, 1, 2));
        window.clear();
        assert_eq!(window.counts(), (0, 0, 0));
        window.push(RECORDED | FAILED);
        assert_eq!(window.counts(), (1, 1, 0));
    }
}
