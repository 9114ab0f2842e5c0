"""weightbridge's own test harnesses (private: no stability promise; product code never imports them)."""
