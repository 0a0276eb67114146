"""What the tokens are worth: agreement between precisions and systems, router quality, HumanEval."""
