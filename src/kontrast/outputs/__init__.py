"""What a user takes away from a run: embeddings with file names (``embed``) and a portable backbone (``export``)."""
