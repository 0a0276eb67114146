"""The benchmark scripts, by concern; a package so that scripts in one folder import pieces of another."""
