"""Side by side with llama.cpp and the serving baselines: the scripts behind README's table."""
