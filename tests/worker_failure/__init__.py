"""Failure tests of cluster execution: real ``qinglong worker`` and ``qinglong run`` processes."""
