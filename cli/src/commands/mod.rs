pub mod bench;
pub mod cache;
pub mod crd;
pub mod demo;
pub mod run;
pub mod simulate;
pub mod validate;
pub mod worker;
