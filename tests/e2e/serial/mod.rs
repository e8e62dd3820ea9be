//! The topics that must run alone, one test at a time, after every other
//! topic: they restart the agent ([`restart`], [`eviction`], [`devices`]),
//! add a node of their own ([`image_gc`]) or take most of the node's cpu
//! ([`admission`]).

mod admission;
mod devices;
mod eviction;
mod image_gc;
mod restart;
