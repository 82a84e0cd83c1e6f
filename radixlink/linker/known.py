"""Compatibility name only: the record of known pages is the tree's stored index now
(``radixlink.tree.stored.StoredPages``, one record with one clock for "the store holds this
page"; node store marks are views on it). ``jobs.select_pages`` still names it here.
"""

from radixlink.tree.stored import StoredPages as KnownPages

__all__ = ["KnownPages"]
