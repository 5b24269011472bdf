//! The model below the simulator's process state (`sim.rs`) and the exports (`driver/`): the
//! objects the driver API hands out handles to, as the simulator holds them.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

pub mod capture;
pub mod memory;
pub mod module;

/// Live objects by handle value, so a stale or made-up handle is an error, not a crash.
pub struct Registry<T> {
    map: Mutex<HashMap<usize, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Registry<T> {
    /// Registers `obj`; its handle is its address.
    pub fn insert(&self, obj: Arc<T>) -> usize {
        let h = Arc::as_ptr(&obj) as usize;
        self.map.lock().insert(h, obj);
        h
    }
    pub fn get(&self, h: usize) -> Option<Arc<T>> {
        self.map.lock().get(&h).cloned()
    }
    pub fn remove(&self, h: usize) -> Option<Arc<T>> {
        self.map.lock().remove(&h)
    }
    pub fn values(&self) -> Vec<Arc<T>> {
        self.map.lock().values().cloned().collect()
    }
}
