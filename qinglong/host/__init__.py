"""The plugin host: settings, plugin loading, the composition root, the lifecycle and the CLI.

The host knows the contracts and nothing of any plugin: it loads plugins through entry points of
group ``qinglong.plugins``, only those the chosen profile names plus those the settings enable.
"""
