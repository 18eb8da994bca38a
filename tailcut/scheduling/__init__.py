"""Flow scheduling: CadentFlow tags and the testbed's enforcement of them."""
