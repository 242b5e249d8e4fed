//! x
mod factory;
pub use factory::*;
