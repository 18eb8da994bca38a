"""Flow-level simulator of fair sharing, coflow (MADD) and CadentFlow at scales beyond this host."""
