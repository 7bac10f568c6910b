"""Vocabulary many packages share and none owns (`device`: what a published device is called)."""
