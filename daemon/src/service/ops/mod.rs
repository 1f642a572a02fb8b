//! One file per request that changes a claim's containers; each reads guard → plan → admit
//! → transaction → apply → commit.

mod attach;
mod detach;
mod prepare;
mod queries;
mod unprepare;
