//! Publishing into a `watch` channel only when the value differs, so a receiver wakes for
//! changes, not for every pass of the loop that computes them.

use tokio::sync::watch;

/// Replace the channel's value with `next` and wake receivers only if it differs; returns
/// whether it did.
pub fn if_changed<T: PartialEq>(tx: &watch::Sender<T>, next: T) -> bool {
    tx.send_if_modified(|current| {
        let changed = *current != next;
        if changed {
            *current = next;
        }
        changed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_equal_value_wakes_no_receiver_and_a_different_one_does() {
        let (tx, mut rx) = watch::channel(1);
        rx.mark_unchanged();
        assert!(!if_changed(&tx, 1));
        assert!(!rx.has_changed().expect("open"));
        assert!(if_changed(&tx, 2));
        assert!(rx.has_changed().expect("open"));
        assert_eq!(*rx.borrow_and_update(), 2);
    }
}
