"""corral.agent"""
