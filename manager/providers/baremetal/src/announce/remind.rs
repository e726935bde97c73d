//! When to tell about a lasting finding (pure): at once when it is new or changed, then again
//! every interval while it lasts; a finding gone is forgotten, so its return is told at once.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// The findings told and when, by key.
#[derive(Debug)]
pub struct Reminder<K, V> {
    last: BTreeMap<K, (V, Instant)>,
}

impl<K, V> Default for Reminder<K, V> {
    fn default() -> Self {
        Self { last: BTreeMap::new() }
    }
}

impl<K: Ord + Clone, V: PartialEq + Clone> Reminder<K, V> {
    /// The findings among `current` to tell now: new ones, changed ones, and those last told
    /// at least `every` ago.
    pub fn due(&mut self, current: Vec<(K, V)>, now: Instant, every: Duration) -> Vec<V> {
        self.last.retain(|key, _| current.iter().any(|(k, _)| k == key));
        let mut due = Vec::new();
        for (key, value) in current {
            let tell = match self.last.get(&key) {
                Some((told, at)) => *told != value || now.saturating_duration_since(*at) >= every,
                None => true,
            };
            if tell {
                self.last.insert(key, (value.clone(), now));
                due.push(value);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_is_told_when_new_or_changed_and_again_after_the_interval() {
        let mut r: Reminder<&str, u8> = Reminder::default();
        let t0 = Instant::now();
        let every = Duration::from_secs(600);
        assert_eq!(r.due(vec![("web", 1)], t0, every), [1]);
        assert_eq!(r.due(vec![("web", 1)], t0 + Duration::from_secs(10), every), Vec::<u8>::new());
        assert_eq!(r.due(vec![("web", 2)], t0 + Duration::from_secs(20), every), [2], "changed");
        assert_eq!(r.due(vec![("web", 2)], t0 + Duration::from_secs(620), every), [2], "lasting");
        assert_eq!(r.due(vec![], t0 + Duration::from_secs(630), every), Vec::<u8>::new());
        assert_eq!(r.due(vec![("web", 2)], t0 + Duration::from_secs(640), every), [2], "back after it went");
    }
}
