"""corral.store"""
