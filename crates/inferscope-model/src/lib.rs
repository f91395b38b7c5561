//! inferscope-model: the CPU executor (under construction).
